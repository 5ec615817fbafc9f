"""Checks the shared-memory collectives against gloo's on live ranks (run by torchrun from
tests/trainer/test_shared_memory_comm.py; rank 0 writes what it saw as JSON).

    torchrun --nproc_per_node N shared_memory_worker.py OUT.json
"""
import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from trainops.trainer.shared_memory_comm import (  # noqa: E402
    SHM_DIR,
    SharedBuffers,
    SharedMemoryAllGather,
    SharedMemoryReduceScatter,
    shared_buffers_for,
)


def outcome(action) -> str:
    try:
        return repr(action())
    except (ValueError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"


def main(out: str) -> None:
    dist.init_process_group("gloo")
    group = dist.group.WORLD
    rank, world = dist.get_rank(), dist.get_world_size()
    buffers = shared_buffers_for(group, "auto", "cpu")
    seen: dict = {"buffers": buffers is not None, "exact": [], "close": [], "made_in_shm": [], "gathered_in_shm": []}
    reduce_scatter, all_gather = SharedMemoryReduceScatter(buffers), SharedMemoryAllGather(buffers)
    gather_in_place = SharedMemoryAllGather(buffers, in_place=True)
    # an input the first buffers (one page a half) cannot hold, an output they could: neither goes there
    too_big = reduce_scatter.allocate((world * 600,), dtype=torch.float32, device=torch.device("cpu"))
    output = reduce_scatter.allocate((600,), dtype=torch.float32, device=torch.device("cpu"))
    seen["first_made_in_shm"] = [buffers.holds(too_big), buffers.holds(output)]
    reduce_scatter(output, too_big.fill_(1.0), group)
    seen["exact"].append(bool(torch.equal(output, torch.full((600,), float(world)))))
    # growing sizes (each a new buffer generation), then smaller ones (reusing the halves)
    for numel in (world * 3, world * 1000, world * 700_001, world * 5, world * 1_200_000):
        full = torch.randn(numel, generator=torch.Generator().manual_seed(rank * 7919 + numel))
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            mine, theirs = torch.empty(numel // world), torch.empty(numel // world)
            reduce_scatter(mine, full, group, op)
            dist.reduce_scatter_tensor(theirs, full.clone(), op=op, group=group)
            seen["exact" if world == 2 else "close"].append(
                float((mine - theirs).abs().max()) if world > 2 else bool(torch.equal(mine, theirs)))
        # FSDP's way: it allocates the input, fills it with the gradients, then allocates the output
        made_input = reduce_scatter.allocate((numel,), dtype=full.dtype, device=full.device)
        made_input.copy_(full)
        made_output = reduce_scatter.allocate((numel // world,), dtype=full.dtype, device=full.device)
        seen["made_in_shm"].append([buffers.holds(made_input), buffers.holds(made_output)])
        reduce_scatter(made_output, made_input, group, dist.ReduceOp.AVG)
        dist.reduce_scatter_tensor(theirs, full.clone(), op=dist.ReduceOp.AVG, group=group)
        seen["exact" if world == 2 else "close"].append(
            float((made_output - theirs).abs().max()) if world > 2 else bool(torch.equal(made_output, theirs)))
        gathered, expected = torch.empty(numel), torch.empty(numel)
        shard = full[:numel // world].clone()
        all_gather(gathered, shard, group)
        dist.all_gather_into_tensor(expected, shard, group=group)
        seen["exact"].append(bool(torch.equal(gathered, expected)))
        in_place = torch.zeros(numel)  # FSDP's own layout: the input is this rank's slice of the output
        in_place[rank * (numel // world):(rank + 1) * (numel // world)] = shard
        all_gather(in_place, in_place[rank * (numel // world):(rank + 1) * (numel // world)], group)
        seen["exact"].append(bool(torch.equal(in_place, expected)))
        # one FSDP unit's way: the output made in the buffer, FSDP's shard written into it, read after wait()
        made = gather_in_place.allocate((numel,), dtype=full.dtype, device=full.device)
        made[rank * (numel // world):(rank + 1) * (numel // world)] = shard
        work = gather_in_place(made, made[rank * (numel // world):(rank + 1) * (numel // world)], group)
        seen["gathered_in_shm"].append(buffers.holds(made))
        if work is not None:
            work.wait()
        seen["exact"].append(bool(torch.equal(made, expected)))
    # a collective before FSDP has copied an in-buffer gather out would let a peer overwrite it: refused
    made = gather_in_place.allocate((world * 4,), dtype=torch.float32, device=torch.device("cpu"))
    gather_in_place(made, made[rank * 4:(rank + 1) * 4], group)
    seen["unread_gather"] = outcome(lambda: buffers.exchange(torch.zeros(4)))
    seen["bad_dir_auto"] = outcome(lambda: shared_buffers_for(group, "auto", "cpu", Path("/nonexistent-shm")))
    seen["bad_dir_strict"] = outcome(lambda: shared_buffers_for(group, "shared_memory", "cpu",
                                                                Path("/nonexistent-shm")))
    # one host name, a /dev/shm of its own per rank (containers on two machines): rank 0's file is
    # missing from the others' view, and a file of the same name there is not rank 0's
    own_shm = SHM_DIR if rank == 0 else Path(tempfile.mkdtemp(prefix="own-shm-"))
    seen["private_shm_auto"] = outcome(lambda: shared_buffers_for(group, "auto", "cpu", own_shm))
    seen["private_shm_strict"] = outcome(lambda: shared_buffers_for(group, "shared_memory", "cpu", own_shm))
    made_nothing: list[bool | None] = [None] * world
    dist.all_gather_object(made_nothing, rank == 0 or not any(own_shm.iterdir()))
    seen["private_shm_made_nothing"] = all(made_nothing)
    decoy = SharedBuffers(group, strict=True, shm_dir=own_shm)
    if rank:
        with open(own_shm / f"trainops-{decoy.token}-1", "wb") as file:
            file.truncate(2 * world * 4096)  # the first buffer's size: two halves of one page per rank
    seen["decoy_strict"] = outcome(lambda: decoy.exchange(torch.zeros(1)))
    if rank:
        shutil.rmtree(own_shm)
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
