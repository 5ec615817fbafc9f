"""Checkpoint tools: list a run's checkpoints, verify one against its commit record, and measure
what a save and a load cost on this storage.

Listing and verification wrap `trainops.trainer.checkpoint` (the format's owner); the measurement goes
through `torch.distributed.checkpoint` itself, so the planner's write cost is a real DCP number.
"""
from __future__ import annotations

import shutil
import tempfile
import time
import warnings
from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from trainops.run_records import read_journal
from trainops.tools.base import ToolError, tool
from trainops.tools.ids import RunRef
from trainops.tools.reliability.evidence import inert
from trainops.trainer.checkpoint_files import CheckpointInfo, CheckpointVerification, step_dir_name
from trainops.trainer.checkpoint_files import list_checkpoints as trainer_list
from trainops.trainer.checkpoint_files import verify_checkpoint as trainer_verify
from trainops.workspace import check_id, confine, home, runs_dir


def _confined(path: str, field: str, tool_name: str) -> Path:
    try:
        return confine(path, field)
    except ValueError as exc:
        raise ToolError(tool_name, str(exc)) from None


def _run_checkpoint_folder(run: str, tool_name: str) -> Path:
    try:
        check_id("run", run)
    except ValueError as exc:
        raise ToolError(tool_name, str(exc)) from None
    run_dir = runs_dir() / run
    if not run_dir.is_dir():
        known = sorted(p.name for p in runs_dir().iterdir() if p.is_dir())[-5:]
        raise ToolError(tool_name, f"run {run!r} not found in {runs_dir()}; recent runs: {', '.join(known) or 'none'}")
    return _confined(str(run_dir / "checkpoints"), "run checkpoints", tool_name)


class ListCheckpointsInput(BaseModel):
    run: RunRef | None = Field(None, description="Run id under $TRAINOPS_HOME/runs (its checkpoints/ folder).")
    folder: str | None = Field(None,
                               description="A checkpoint folder inside the workspace (or a [governance] root), when "
                                           "not a run's.")

    @model_validator(mode="after")
    def _one_place(self) -> ListCheckpointsInput:
        if (self.run is None) == (self.folder is None):
            raise ValueError(f"give exactly one of run or folder (got run={self.run!r}, folder={self.folder!r})")
        return self


class SkippedCheckpoint(BaseModel):
    step: int
    reason: str = Field(description="Why the start did not load it, as the trainer journaled it (quoted, escaped).")


class RunStart(BaseModel):
    """One start of the run from a checkpoint (a resume or a restart), from the run's checkpoint journal."""
    time: float = Field(description="Unix seconds the load finished.")
    loaded_step: int = Field(description="The checkpoint step it loaded.")
    loaded: str = Field(description="The folder name of the checkpoint it loaded (step-NNNNNNNN).")
    verified: bool = Field(description="Checked against its COMMIT.json as it was loaded.")
    skipped: list[SkippedCheckpoint] = Field(default_factory=list, description="Newer committed checkpoints that "
                                             "failed verification just before, so this older one was loaded.")


class ListCheckpointsOutput(BaseModel):
    folder: str
    checkpoints: list[CheckpointInfo] = Field(description="Oldest step first.")
    newest_committed_step: int | None = Field(description="The step a resume would load, if any.")
    starts: list[RunStart] = Field(default_factory=list, description="A run's starts from a checkpoint, oldest "
                                   "first: which checkpoint each loaded and which corrupt ones it skipped (a "
                                   "folder given alone has no journal: empty).")


def _starts(run_dir: Path) -> list[RunStart]:
    """Each load of the journal with the fallbacks written since the previous load."""
    journal, starts, after = read_journal(run_dir), [], float("-inf")
    for load in journal.loads:
        skipped = [SkippedCheckpoint(step=f.step, reason=inert(f.reason)) for f in journal.fallbacks
                   if after < f.time <= load.time]
        starts.append(RunStart(time=load.time, loaded_step=load.step, loaded=inert(Path(load.path).name),
                               verified=load.verified, skipped=skipped))
        after = load.time
    return starts


@tool("list_checkpoints", risk="read", tags=("checkpoint",))
def list_checkpoints(inp: ListCheckpointsInput) -> ListCheckpointsOutput:
    """List the checkpoints of a run (or a folder): step, committed or partial, size, time, the
    newest committed step a resume would load, and for a run each start's loaded checkpoint and the
    corrupt ones it skipped."""
    folder = (_run_checkpoint_folder(inp.run, "list_checkpoints") if inp.run
              else _confined(inp.folder, "folder", "list_checkpoints"))
    entries = trainer_list(folder)
    committed = [e.step for e in entries if e.committed]
    return ListCheckpointsOutput(folder=str(folder), checkpoints=entries,
                                 newest_committed_step=max(committed, default=None),
                                 starts=_starts(folder.parent) if inp.run else [])


class VerifyCheckpointInput(BaseModel):
    path: str | None = Field(None,
                             description="Checkpoint folder (step-NNNNNNNN) to verify, inside the workspace or a "
                                         "[governance] root.")
    run: RunRef | None = Field(None, description="Run id; verifies its checkpoint at `step`, or the newest one.")
    step: int | None = Field(None, ge=0, le=10**12,
                             description="Step of the run's checkpoint to verify (default: newest).")

    @model_validator(mode="after")
    def _one_target(self) -> VerifyCheckpointInput:
        if (self.path is None) == (self.run is None):
            raise ValueError(f"give exactly one of path or run (got path={self.path!r}, run={self.run!r})")
        if self.step is not None and self.run is None:
            raise ValueError(f"step={self.step} needs run: give run with step, or the checkpoint path alone")
        return self


@tool("verify_checkpoint", risk="read", tags=("checkpoint",))
def verify_checkpoint(inp: VerifyCheckpointInput) -> CheckpointVerification:
    """Verify a checkpoint is complete: committed, every file present, sizes and sha256 checksums
    matching its COMMIT.json. Reports missing and corrupted files by name."""
    if inp.path is not None:
        target = _confined(inp.path, "path", "verify_checkpoint")
    else:
        folder = _run_checkpoint_folder(inp.run, "verify_checkpoint")
        if inp.step is not None:
            target = folder / step_dir_name(inp.step)
        else:
            found = trainer_list(folder)
            if not found:
                raise ToolError("verify_checkpoint", f"run {inp.run!r} has no checkpoints in {folder}")
            target = Path(found[-1].path)
    return trainer_verify(target)


class MeasureIoInput(BaseModel):
    size_mib: int = Field(64, ge=1, le=4096,
                          description="Size of the state to save and load, MiB (fp32 tensors, held in memory twice).")
    tensors: int = Field(8, ge=1, le=1024, description="Number of tensors the state is split into.")
    folder: str | None = Field(None,
                               description="An existing folder where checkpoints go, inside the workspace or a "
                                           "[governance] root; default $TRAINOPS_HOME. The test checkpoint goes to a "
                                           "temporary folder inside it, removed afterwards.")


class MeasureIoOutput(BaseModel):
    size_mib: float = Field(description="Bytes saved and loaded, MiB.")
    save_s: float = Field(description="dcp.save wall time (files fsync'd), seconds.")
    load_s: float = Field(description="dcp.load wall time into preallocated tensors, seconds.")
    save_mib_s: float
    load_mib_s: float
    folder: str = Field(description="Folder the test checkpoint was written under (and removed from afterwards).")
    method: str = Field(description="How it was measured.")


@tool("measure_checkpoint_io", risk="read", tags=("checkpoint", "measure"))
def measure_checkpoint_io(inp: MeasureIoInput) -> MeasureIoOutput:
    """Measure checkpoint save and load time of a state of `size_mib` MiB through
    torch.distributed.checkpoint in one process on the target storage; the result feeds
    plan_checkpoint_interval (save_s) and restart estimates (load_s)."""
    import torch
    import torch.distributed.checkpoint as dcp

    parent = _confined(inp.folder, "folder", "measure_checkpoint_io") if inp.folder else home()
    numel = inp.size_mib * (1 << 20) // 4 // inp.tensors
    state = {f"t{i}": torch.randn(numel) for i in range(inp.tensors)}
    size_mib = sum(t.numel() * 4 for t in state.values()) / (1 << 20)
    try:
        target = Path(tempfile.mkdtemp(prefix=".ckpt-io-", dir=parent))
    except OSError as exc:
        raise ToolError("measure_checkpoint_io",
                        f"cannot create a folder in {parent}: {exc}; pass an existing writable folder") from None
    with warnings.catch_warnings():  # one process without a process group is the intent here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        try:
            started = time.perf_counter()
            dcp.save(state, checkpoint_id=str(target))
            save_s = time.perf_counter() - started
            loaded = {k: torch.empty_like(v) for k, v in state.items()}
            started = time.perf_counter()
            dcp.load(loaded, checkpoint_id=str(target))
            load_s = time.perf_counter() - started
        finally:
            shutil.rmtree(target, ignore_errors=True)
    if not all(torch.equal(state[k], loaded[k]) for k in state):
        raise ToolError("measure_checkpoint_io",
                        f"the state loaded from {target} differs from the one saved: the storage corrupts data")
    return MeasureIoOutput(
        size_mib=size_mib, save_s=save_s, load_s=load_s, save_mib_s=size_mib / save_s, load_mib_s=size_mib / load_s,
        folder=str(parent), method=f"torch.distributed.checkpoint save/load, one process, {inp.tensors} fp32 tensors",
    )
