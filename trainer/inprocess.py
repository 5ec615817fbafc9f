"""A worker of an in-process-restart job (the rank side of trainops.trainer.supervisor).

Every worker imports torch and the trainer once, then waits in the supervisor's TCPStore for an
assignment: a rank, the world size and a group generation. A warm spare is a worker that has no
assignment yet. A generation's ranks restore (join the group, build the model, load the checkpoint,
do a first step) under `resilience.restore_timeout_s`, each waiting for the slowest; once all have
done their first step, a peer silent for `resilience.collective_timeout_s` is hung. When a collective
fails (a peer died, or the bounded gloo timeout ran out on a hung one), the worker leaves it: it destroys the
process group, drops the model, tells the supervisor, and waits for the next assignment in the
same process, with its modules and imports kept. Each generation's group lives under its own
store prefix, so nothing of a broken group is reused. A worker takes its device as a torchrun rank
does (`rank_device`: its GPU with NCCL, else the CPU with gloo); on a GPU it aborts the broken NCCL
communicators before destroying the group (torch's `_abort_process_group`). Only the CPU path has
run here: no GPU was lent to verify the NCCL one.

Store keys (all under the supervisor's store): `ready/W` (worker W is imported: pid, time),
`assign/W/K` (W's K-th assignment, or "stop"), `joined/G/R`, `loaded/G`, `first_step/G`
(the timeline of generation G), `failed/G/R` (rank R left generation G's group, and why),
`done/G/R` (rank R finished training).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from trainops.run_folder import RunFiles, open_rank_log
from trainops.trainer.config import RESTORE_TIMEOUT_S, load_config
from trainops.trainer.metrics import note_exit
from trainops.trainer.train import LogTee, NonFiniteLoss, exit_now, note_termination, rank_device, train
from trainops.trainer.workers import STORE_SECRET_ENV, secured

STORE_ENV = "TRAINOPS_INPROCESS_STORE"
WORKER_ENV = "TRAINOPS_INPROCESS_WORKER"
STOP = "stop"
POLL_S = 0.05
WARM_MODULES = ("torch._inductor.config",  # torch.use_deterministic_algorithms imports it, dynamo and sympy: ~4 s
                "torch.distributed.fsdp", "torch.distributed.tensor", "torch.distributed.checkpoint",
                "torch.distributed.checkpoint.state_dict", "torch.distributed.checkpoint._fsspec_filesystem",
                "trainops.trainer.checkpoint_reader",
                "trainops.trainer.shared_memory_comm")
"""What train() imports on its first call: a worker imports them before it says it is ready, so a
warm spare admitted into a broken group does not spend the recovery importing (measured on the CPU:
a cold spare's load phase 5.5 s, a warm one's 1.0 s)."""


def store_from_env() -> dist.Store:
    """The supervisor's store, under the job's secret namespace (workers.STORE_SECRET_ENV)."""
    host, _, port = os.environ[STORE_ENV].rpartition(":")
    return secured(dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30)),
                   os.environ.get(STORE_SECRET_ENV, ""))


def await_key(store: dist.TCPStore, key: str) -> str | None:
    """The value of `key` once the supervisor sets it; None when the store is gone (the supervisor
    died: this worker must not outlive it)."""
    while True:
        try:
            if store.check([key]):
                return store.get(key).decode()
        except (RuntimeError, dist.DistError):
            return None
        if os.getppid() == 1:  # orphaned: the supervisor is gone
            return None
        time.sleep(POLL_S)



def warm_imports() -> None:
    for name in WARM_MODULES:
        with contextlib.suppress(ImportError):  # DCP tries its fsspec backend the same way: absent, it goes without
            importlib.import_module(name)


def serve(run_dir: Path) -> int:
    """Wait for assignments and train each one; 0 when training finished or the supervisor said
    stop, 1 when the supervisor is gone or the run failed in a way a restart cannot mend."""
    # on a GPU the worker aborts a broken NCCL group itself (torch's abort wants the watchdog's own handling off)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
    worker = int(os.environ[WORKER_ENV])
    store = store_from_env()
    warm_imports()
    store.set(f"ready/{worker}", json.dumps({"pid": os.getpid(), "time": time.time()}))
    streams = sys.stdout, sys.stderr
    for count in range(1 << 20):
        raw = await_key(store, f"assign/{worker}/{count}")
        if raw is None:
            return 1
        if raw == STOP:
            return 0
        job = json.loads(raw)
        rank, world, generation, timeout_s = job["rank"], job["world_size"], job["generation"], job["timeout_s"]
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(job["local_rank"]), WORLD_SIZE=str(world),
                          LOCAL_WORLD_SIZE=str(job["local_world_size"]), GROUP_RANK=str(job["node"]),
                          TORCHELASTIC_RESTART_COUNT=str(generation))
        log_file = open_rank_log(run_dir, rank)
        sys.stdout, sys.stderr = LogTee(streams[0], log_file), LogTee(streams[1], log_file)
        note_termination(run_dir, rank)
        try:
            outcome, detail = _train_generation(store, run_dir, rank, world, generation, timeout_s, train,
                                                restore_timeout_s=job["restore_timeout_s"])
        except NonFiniteLoss as error:  # the weights diverged: a restart would only repeat it
            print(f"rank {rank} failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            note_exit(run_dir, rank, f"{type(error).__name__}: {error}")
            return 1
        finally:
            sys.stdout, sys.stderr = streams
            log_file.close()
        store.set(f"{outcome}/{generation}/{rank}", detail)
        if outcome == "done":
            return 0
    return 1


def _train_generation(store, run_dir: Path, rank: int, world: int, generation: int, timeout_s: float,
                      train, restore_timeout_s: float = RESTORE_TIMEOUT_S) -> tuple[str, str]:
    """Join generation `generation`'s group as `rank` and train: ("done", "") or ("failed", why).
    Until every rank has done its first step, a collective waits up to `restore_timeout_s` (a peer
    still joining, loading or compiling is slow, not hung); from then on `timeout_s`. Whatever
    happens, the group is destroyed and the model released before it returns."""
    backend, device = rank_device()
    try:
        dist.init_process_group(backend, store=dist.PrefixStore(f"gen{generation}/", store), rank=rank,
                                world_size=world, timeout=timedelta(seconds=max(restore_timeout_s, timeout_s)),
                                device_id=device if device.type == "cuda" else None)
    except RuntimeError as error:  # a peer did not join within the deadline: this one stays, for the next
        return "failed", _left(rank, generation, error)
    store.set(f"joined/{generation}/{rank}", str(time.time()))

    def progress(event: str, step: int) -> None:
        if event == "first_step":  # every rank restored and stepped: a silent peer is hung from here on
            dist.barrier()
            dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout_s))
        if rank == 0:
            store.set(f"{event}/{generation}", json.dumps({"time": time.time(), "step": step}))

    try:
        train(load_config(RunFiles(run_dir).config), run_dir, rank, world, device, progress)
        return "done", ""
    except Exception as error:  # a broken collective: leave it, keep the process
        if isinstance(error, NonFiniteLoss):
            raise
        return "failed", _left(rank, generation, error)
    finally:
        if device.type == "cuda":  # NCCL's communicators may still wait on the dead peer: abort them first
            dist.distributed_c10d._abort_process_group()
        dist.destroy_process_group()
        gc.collect()  # the old model, optimizer and shared-memory mappings go with the failed generation


def _left(rank: int, generation: int, error: Exception) -> str:
    """Why `rank` left the group: the error's first line, also on its log."""
    why = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"[:500]
    print(f"rank {rank} left generation {generation}'s group: {why}", file=sys.stderr, flush=True)
    return why


def main(argv: list[str] | None = None) -> int:
    """A worker's entry point, started by trainops.trainer.supervisor (never by torchrun)."""
    parser = argparse.ArgumentParser(description="an in-process-restart worker: ranks and warm spares alike")
    parser.add_argument("--run-dir", required=True, help="run folder holding config.toml")
    return serve(Path(parser.parse_args(argv).run_dir))


if __name__ == "__main__":
    exit_now(main())
