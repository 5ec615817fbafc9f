"""Checks the shared-memory collectives against gloo's on live ranks (run by torchrun from
tests/trainer/test_shared_memory_comm.py; rank 0 writes what it saw as JSON).

    torchrun --nproc_per_node N shared_memory_worker.py OUT.json
"""
import json
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from trainops.trainer.shared_memory_comm import (  # noqa: E402
    SharedMemoryAllGather,
    SharedMemoryReduceScatter,
    shared_buffers_for,
)


def outcome(action) -> str:
    try:
        return repr(action())
    except ValueError as error:
        return f"ValueError: {error}"


def main(out: str) -> None:
    dist.init_process_group("gloo")
    group = dist.group.WORLD
    rank, world = dist.get_rank(), dist.get_world_size()
    buffers = shared_buffers_for(group, "auto", "cpu")
    seen: dict = {"buffers": buffers is not None, "exact": [], "close": []}
    reduce_scatter, all_gather = SharedMemoryReduceScatter(buffers), SharedMemoryAllGather(buffers)
    # growing sizes (each a new buffer generation), then smaller ones (reusing the halves)
    for numel in (world * 3, world * 1000, world * 700_001, world * 5, world * 1_200_000):
        full = torch.randn(numel, generator=torch.Generator().manual_seed(rank * 7919 + numel))
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            mine, theirs = torch.empty(numel // world), torch.empty(numel // world)
            reduce_scatter(mine, full, group, op)
            dist.reduce_scatter_tensor(theirs, full.clone(), op=op, group=group)
            seen["exact" if world == 2 else "close"].append(
                float((mine - theirs).abs().max()) if world > 2 else bool(torch.equal(mine, theirs)))
        gathered, expected = torch.empty(numel), torch.empty(numel)
        shard = full[:numel // world].clone()
        all_gather(gathered, shard, group)
        dist.all_gather_into_tensor(expected, shard, group=group)
        seen["exact"].append(bool(torch.equal(gathered, expected)))
        in_place = torch.zeros(numel)  # FSDP's own layout: the input is this rank's slice of the output
        in_place[rank * (numel // world):(rank + 1) * (numel // world)] = shard
        all_gather(in_place, in_place[rank * (numel // world):(rank + 1) * (numel // world)], group)
        seen["exact"].append(bool(torch.equal(in_place, expected)))
    seen["bad_dir_auto"] = outcome(lambda: shared_buffers_for(group, "auto", "cpu", Path("/nonexistent-shm")))
    seen["bad_dir_strict"] = outcome(lambda: shared_buffers_for(group, "shared_memory", "cpu",
                                                                Path("/nonexistent-shm")))
    real_hostname = socket.gethostname
    socket.gethostname = lambda: f"node{rank}"  # every rank on a host of its own
    seen["hosts_auto"] = outcome(lambda: shared_buffers_for(group, "auto", "cpu"))
    seen["hosts_strict"] = outcome(lambda: shared_buffers_for(group, "shared_memory", "cpu"))
    socket.gethostname = real_hostname
    seen["gpu_strict"] = outcome(lambda: shared_buffers_for(group, "shared_memory", "cuda"))
    dist.barrier()
    if rank == 0:
        Path(out).write_text(json.dumps(seen))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
