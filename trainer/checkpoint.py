"""The DCP checkpointer (torch.distributed.checkpoint): sync, async, async_pinned saves and
verified loads. The on-disk layout and its offline inspection live in checkpoint_files.py.

A checkpoint is written into `step-N.tmp/` and becomes `step-N/` only after every rank has
finished and rank 0 has written `COMMIT.json` (file sizes and sha256) and renamed the folder:
an unfinished write is never loaded. Loading verifies the newest commit and falls back to the
previous good one when a file is missing or its checksum differs; on resume one rank of each
replica group reads and broadcasts (trainops.trainer.replica_load, `checkpoint.load_readers`).
Save stall (time the training loop was blocked, including `wait_previous_s` spent waiting for the
previous background write) and total write time go to `RUN/checkpoints.jsonl` for benchmarks and
drills.
"""
from __future__ import annotations

import json
import logging
import random
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from trainops.run_folder import RunFiles
from trainops.trainer.checkpoint_files import (  # noqa: F401 (verify_checkpoint: imported from here too)
    COMMIT_FILE,
    data_files,
    file_sha256,
    list_checkpoints,
    step_dir_name,
    verify_checkpoint,
)
from trainops.trainer.checkpoint_reader import CountedFileSystem, CountedReader, commit_listing, size_problems
from trainops.trainer.replica_load import read_one_per_group

log = logging.getLogger("trainops.trainer.checkpoint")

# ---------------------------------------------------------------- what a checkpoint holds


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class AppState:
    """Everything an exact resume needs: model, optimizer, scheduler, loader position, RNG, step.
    DCP takes it as a `Stateful` (a runtime-checkable protocol: these two methods are the whole of
    it), so this module imports torch.distributed.checkpoint, 0.6 s of every trainer start, only
    when a checkpoint is saved or loaded.

    Model and optimizer go through `get_state_dict`/`set_state_dict`, which speak DDP, FSDP2
    (DTensor shards, resharded on load) and plain modules alike. RNG state differs per rank, so
    it is stored under a per-rank key (DCP keeps one copy of equal keys); a rank the checkpoint
    did not have (a larger world on load) keeps its own seeded RNG. The loader position is the
    same on every rank (trainops.trainer.data derives each rank's slice from it), so it has one key.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: Any | None = None, dataloader: Any | None = None) -> None:
        self.model, self.optimizer = model, optimizer
        self.scheduler, self.dataloader = scheduler, dataloader
        self.step = 0
        self.rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        self.saved_world_size: int | None = None

    def _has_rank_state(self) -> bool:
        return self.saved_world_size is None or self.rank < self.saved_world_size

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd, "step": self.step}
        if self._has_rank_state():
            state["rng"] = {f"rank{self.rank}": _rng_state()}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.dataloader is not None:
            state["dataloader"] = self.dataloader.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model, self.optimizer,
            model_state_dict=state_dict["model"], optim_state_dict=state_dict["optimizer"],
        )
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state_dict["scheduler"])
        if self.dataloader is not None:
            self.dataloader.load_state_dict(state_dict["dataloader"])
        if (rng := state_dict.get("rng", {}).get(f"rank{self.rank}")) is not None:
            _set_rng_state(rng)
        self.step = int(state_dict["step"])


# ---------------------------------------------------------------- saving and loading


class CheckpointSettings(Protocol):
    """The `[checkpoint]` section as the Checkpointer reads it (trainops.trainer.config.CheckpointConfig)."""
    enable: bool
    interval: int
    mode: Literal["sync", "async", "async_pinned"]
    keep: int
    folder: str
    load_readers: Literal["one_per_replica_group", "every_rank"]


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")


class Checkpointer:
    """Saves every `interval` steps in the configured mode, keeps the last `keep`, loads the
    newest good one. One instance per rank; every rank calls every method at the same step."""
    def __init__(self, cfg: CheckpointSettings, run_dir: str | Path, rank: int,
                 replicas: list[list[int]] | None = None) -> None:
        """`replicas`: the ranks that hold identical state (trainops.trainer.replica_load.replica_groups);
        None: every rank holds its own."""
        self.cfg, self.rank = cfg, rank
        self.run_dir = Path(run_dir)
        self.folder = self.run_dir / cfg.folder
        self.journal = RunFiles(self.run_dir).checkpoint_journal
        self.distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if self.distributed else 1
        self.replicas = replicas or [[r] for r in range(self.world_size)]
        # Background writes run collectives; a group of their own keeps them from interleaving
        # with the training loop's collectives on the default group.
        self._pg = None
        if cfg.mode != "sync" and self.distributed:
            self._pg = dist.new_group(backend="gloo")
        self._stager = None
        if cfg.mode == "async_pinned":
            on_gpu = torch.cuda.is_available()
            self._stager = _kept_stager(StagingOptions(
                use_pinned_memory=on_gpu, use_shared_memory=False,
                use_async_staging=on_gpu, use_non_blocking_copy=on_gpu,
            ))
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-commit")
        self._pending: Future | None = None

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def maybe_save(self, step: int, app: AppState, *, last_step: bool = False) -> bool:
        """Save when checkpoints are enabled and `step` is on the interval (or is the last)."""
        if not self.cfg.enable or step <= 0:
            return False
        if step % self.cfg.interval != 0 and not last_step:
            return False
        return self.save(step, app)

    def save(self, step: int, app: AppState) -> bool:
        """Write a checkpoint of `app` at `step`; returns False when that step is already committed."""
        started = time.perf_counter()
        self.wait()
        wait_previous_s = time.perf_counter() - started
        final = self.folder / step_dir_name(step)
        if (final / COMMIT_FILE).is_file():
            log.info("checkpoint %s already committed; not writing it again", final)
            return False
        tmp = self.folder / f"{step_dir_name(step)}.tmp"
        if self.rank == 0:
            for stale in self.folder.glob("step-*.tmp"):
                shutil.rmtree(stale, ignore_errors=True)
            tmp.mkdir(parents=True)
        self._barrier()
        app.step = step
        state = {"app": app}

        if self.cfg.mode == "sync":
            dcp.save(state, checkpoint_id=tmp, no_dist=not self.distributed)
            self._commit(step, tmp, final, started, None, wait_previous_s)
            self._barrier()
            return True
        response = dcp.async_save(
            state, checkpoint_id=tmp, process_group=self._pg, async_stager=self._stager,
            no_dist=not self.distributed,
        )
        if isinstance(response, Future):
            upload = response
        else:  # staged on a background stream: parameters must not change until staging is done
            response.staging_completion.result()
            upload = response.upload_completion
        stall_s = time.perf_counter() - started
        self._pending = self._committer.submit(
            self._finish_async, step, tmp, final, started, stall_s, wait_previous_s, upload
        )
        return True

    def _finish_async(self, step: int, tmp: Path, final: Path, started: float,
                      stall_s: float, wait_previous_s: float, upload: Future) -> None:
        upload.result()
        self._commit(step, tmp, final, started, stall_s, wait_previous_s)

    def _commit(self, step: int, tmp: Path, final: Path, started: float, stall_s: float | None,
                wait_previous_s: float) -> None:
        """Rank 0, after all ranks wrote (DCP gathers every rank's write result before returning
        on the coordinator): checksum, write COMMIT.json last, rename, prune, journal."""
        if self.rank != 0:
            return
        files = {
            str(p.relative_to(tmp)): {"size_bytes": p.stat().st_size, "sha256": file_sha256(p)}
            for p in data_files(tmp)
        }
        commit = {
            "step": step, "time": time.time(), "mode": self.cfg.mode,
            "world_size": self.world_size, "files": files,
        }
        partial = tmp / f"{COMMIT_FILE}.partial"
        partial.write_text(json.dumps(commit, indent=1))
        partial.rename(tmp / COMMIT_FILE)
        tmp.rename(final)
        write_s = time.perf_counter() - started
        pruned = self._prune()
        _append_jsonl(self.journal, {
            "event": "save", "step": step, "mode": self.cfg.mode, "world_size": self.world_size,
            "stall_s": write_s if stall_s is None else stall_s, "write_s": write_s,
            "wait_previous_s": wait_previous_s,
            "size_bytes": sum(f["size_bytes"] for f in files.values()),
            "path": str(final), "pruned_steps": pruned, "time": commit["time"],
        })

    def _prune(self) -> list[int]:
        if self.cfg.keep <= 0:
            return []
        committed = [info for info in list_checkpoints(self.folder) if info.committed]
        doomed = committed[: max(0, len(committed) - self.cfg.keep)]
        for info in doomed:
            shutil.rmtree(info.path, ignore_errors=True)
        return [info.step for info in doomed]

    def wait(self) -> None:
        """Block until the background write (if any) is committed; re-raises its error."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def _choose(self, one_reader: bool, rejected: set[str], spent: list[int]) -> tuple[str, int, dict] | None:
        """Rank 0: the newest committed checkpoint not yet rejected whose files are all there at their
        sizes; with every rank reading, also every file's sha256 (one reader per group checks the
        sha256 of what it reads, as it reads). Its path, the world size that saved it, its files."""
        for info in reversed(list_checkpoints(self.folder)):
            if not info.committed or info.path in rejected:
                if not info.committed:
                    log.info("ignoring unfinished checkpoint %s", info.path)
                continue
            folder = Path(info.path)
            try:
                listed, saved_world, commit_bytes = commit_listing(folder)
                spent[0] += commit_bytes
                problem = size_problems(folder, listed)
                if problem is None and not one_reader:
                    fs = CountedFileSystem(folder, listed)
                    problem = fs.verify(set(listed))
                    spent[0] += fs.bytes_read
            except (ValueError, KeyError, TypeError) as err:
                problem = f"checkpoint {folder}: {COMMIT_FILE} is unreadable ({err}); treat as corrupt"
            if problem is None:
                return info.path, saved_world, listed
            self._fall_back(info.step, info.path, problem)
            rejected.add(info.path)
        return None

    def _fall_back(self, step: int, path: str, reason: str) -> None:
        log.warning("%s; falling back to the previous checkpoint", reason)
        _append_jsonl(self.journal, {"event": "fallback", "step": step, "path": path, "reason": reason,
                                     "time": time.time()})

    def load_latest(self, app: AppState) -> int | None:
        """Load the newest verified checkpoint into `app`; returns its step, or None if there is
        none or checkpoints are disabled (a disabled run starts fresh even in an old run folder).
        `checkpoint.load_readers` says who reads storage: one rank per replica group (the others
        receive by broadcast, trainops.trainer.replica_load) or every rank its own part."""
        if not self.cfg.enable:
            return None
        self.wait()
        started = time.perf_counter()
        one_reader = self.cfg.load_readers == "one_per_replica_group"
        rejected: set[str] = set()
        spent = [0]  # bytes this rank read from storage
        groups = self.replicas if one_reader else [[r] for r in range(self.world_size)]
        while True:
            chosen: list[Any] = [self._choose(one_reader, rejected, spent) if self.rank == 0 else None]
            if self.distributed:
                dist.broadcast_object_list(chosen, src=0)
            if chosen[0] is None:
                return None
            path, saved_world, listed = chosen[0]
            app.saved_world_size = saved_world
            try:
                reason = (read_one_per_group(app, Path(path), listed, groups, spent, _rng_state) if one_reader
                          else self._read_every_rank(app, path, spent))
            finally:
                app.saved_world_size = None
            if reason is None:
                break
            if self.rank == 0:
                info = next(i for i in list_checkpoints(self.folder) if i.path == path)
                self._fall_back(info.step, path, reason)
                rejected.add(path)
        self._journal_load(app.step, path, groups, spent[0], time.perf_counter() - started)
        return app.step

    def _read_every_rank(self, app: AppState, path: str, spent: list[int]) -> None:
        """Every rank reads its own part through DCP (the sha256 check was rank 0's, before)."""
        storage = CountedReader(Path(path))
        dcp.load({"app": app}, storage_reader=storage, no_dist=not self.distributed)
        spent[0] += storage.fs.bytes_read

    def _journal_load(self, step: int, path: str, groups: list[list[int]], spent: int, seconds: float) -> None:
        """Rank 0 journals the load with who read storage and how many bytes each rank read."""
        per_rank = [(spent, seconds)]
        if self.distributed:
            per_rank = [None] * self.world_size
            dist.all_gather_object(per_rank, (spent, seconds))
        if self.rank != 0:
            return
        readers = [g[0] for g in groups]
        bytes_read = [b for b, _ in per_rank]
        print(f"loaded checkpoint step {step}: storage read by rank(s) {readers} "
              f"({self.cfg.load_readers}), bytes per rank {bytes_read}", flush=True)
        _append_jsonl(self.journal, {
            "event": "load", "step": step, "path": path, "verified": True, "time": time.time(),
            "load_readers": self.cfg.load_readers, "reader_ranks": readers, "replica_groups": groups,
            "bytes_read": bytes_read, "load_s": max(s for _, s in per_rank),
        })

    def close(self) -> None:
        """Finish any background write, then release the stager and the commit thread."""
        try:
            self.wait()
        finally:
            self._committer.shutdown(wait=True)
            if self._stager is not None:
                self._stager.release()


def _kept_stager(options):
    """A DefaultStager that lives as long as the checkpointer: its pinned buffers are reused by every
    save. torch 2.11's async_save closes a stager it was handed once the upload is done (seen on an
    H200: the second pinned save failed in staging), so `close()` is a no-op here and the
    checkpointer ends it with `release()`."""
    class KeptStager(DefaultStager):
        def close(self) -> None:
            """Ignored: async_save must not end a stager the checkpointer reuses."""
        def release(self) -> None:
            DefaultStager.close(self)

    return KeptStager(options)
