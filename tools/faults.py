"""Fault injection for drills. Process faults (kill, hang) act on a live run through the
pids in its heartbeat files; numeric and slow-rank faults go through the trainer's
config-driven injection points, which must be set at launch (the tool returns the
`faults.*` overrides to launch with). Every injection is appended to `RUN/faults.jsonl`
with its exact wall time, so detection can report its latency."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from trainops.tools.base import ToolError, tool
from trainops.tools.monitoring.base import MonitorError
from trainops.tools.schedulers.base import SchedulerError, SchedulerKind

FaultKind = Literal["kill_rank", "kill_node", "hang", "straggler", "nan", "bitflip", "crash", "corrupt_checkpoint", "drain_node"]
LAUNCH_TIME_KINDS = {"straggler", "nan", "bitflip", "crash"}


class InjectFaultInput(BaseModel):
    kind: FaultKind = Field(description="kill_rank (SIGKILL one rank), kill_node (SIGKILL every rank on a node), hang (SIGSTOP one rank), corrupt_checkpoint (damage the newest checkpoint), drain_node (through the scheduler); straggler, nan, bitflip, crash are trainer injection points set at launch: this returns the overrides to launch with.")
    run: str | None = Field(None, description="Run id or run folder (needed for every kind except drain_node).")
    rank: int = Field(0, ge=0, description="Target rank (kill_rank, hang, straggler, bitflip, crash).")
    node: str | None = Field(None, description="Target node (kill_node, drain_node); kill_node defaults to this host.")
    step: int = Field(5, ge=0, description="Step at which a launch-time fault fires.")
    slow_ms: int = Field(200, ge=1, description="Extra milliseconds per step for a straggler.")
    scheduler: SchedulerKind = "local"

    @model_validator(mode="after")
    def _targets(self) -> "InjectFaultInput":
        if self.kind not in LAUNCH_TIME_KINDS and self.kind != "drain_node" and not self.run:
            raise ValueError(f"kind={self.kind} needs run (a run id or run folder) to find the target")
        if self.kind == "drain_node" and not self.node:
            raise ValueError("kind=drain_node needs node (the node name as the scheduler knows it)")
        return self


class InjectFaultOutput(BaseModel):
    kind: FaultKind
    injected_at: float | None = Field(description="Exact wall time of the injection (Unix seconds); None for launch-time faults, which fire at their step.")
    target: str = Field(description="What was hit: 'rank 1 pid 1234', a node, a checkpoint file.")
    pids: list[int] = Field(default_factory=list)
    overrides: list[str] = Field(default_factory=list, description="For launch-time faults: the faults.* overrides to launch the run with.")
    note: str = ""


def _run_dir(run: str) -> Path:
    from trainops.tools.monitoring.embedded import resolve_run

    try:
        return resolve_run(run)
    except MonitorError as exc:
        raise ToolError("inject_fault", str(exc)) from None


def _rank_pid(run_dir: Path, rank: int) -> int:
    from trainops.tools.monitoring.embedded import read_heartbeats

    beats = read_heartbeats(run_dir)
    if rank not in beats or "pid" not in beats[rank]:
        have = ", ".join(str(r) for r in sorted(beats)) or "none yet"
        raise ToolError("inject_fault", f"no heartbeat with a pid for rank {rank} in {run_dir / 'heartbeat'} (ranks seen: {have}); wait for the run to take a step or pick a rank that exists")
    return int(beats[rank]["pid"])


def record_fault(run_dir: Path, entry: dict) -> None:
    with open(run_dir / "faults.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def _signal(pids: list[int], sig: signal.Signals) -> float:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            raise ToolError("inject_fault", f"pid {pid} is not running; the rank has already exited") from None
    return time.time()


def _corrupt_newest_checkpoint(run_dir: Path) -> tuple[float, str]:
    ckpts = sorted((run_dir / "checkpoints").glob("step-*"))
    if not ckpts:
        raise ToolError("inject_fault", f"no checkpoint under {run_dir / 'checkpoints'}; run with checkpoint.enable=true and wait for a save")
    files = sorted((p for p in ckpts[-1].rglob("*") if p.is_file() and p.stat().st_size > 0), key=lambda p: p.stat().st_size)
    if not files:
        raise ToolError("inject_fault", f"checkpoint {ckpts[-1]} has no data files to corrupt")
    target = files[-1]
    with open(target, "r+b") as fh:
        fh.seek(target.stat().st_size // 2)
        chunk = fh.read(64)
        fh.seek(target.stat().st_size // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))
        fh.flush()
        os.fsync(fh.fileno())
    return time.time(), str(target)


def launch_overrides(inp: InjectFaultInput) -> list[str]:
    """The trainer's [faults] keys for a launch-time fault."""
    if inp.kind == "straggler":
        return [f"faults.slow_rank={inp.rank}", f"faults.slow_ms={inp.slow_ms}"]
    if inp.kind == "nan":
        return [f"faults.nan_step={inp.step}"]
    if inp.kind == "bitflip":
        return [f"faults.bitflip_step={inp.step}", f"faults.bitflip_rank={inp.rank}"]
    return [f"faults.crash_step={inp.step}", f"faults.crash_rank={inp.rank}", "faults.crash_mode=sigkill"]


@tool("inject_fault", risk="mutate", tags=("faults", "drill"))
def inject_fault(inp: InjectFaultInput) -> InjectFaultOutput:
    """Inject a fault for a drill and return its exact wall time: kill a rank or a node's ranks
    (SIGKILL), hang a rank (SIGSTOP), corrupt the newest checkpoint, drain a node; or return
    the launch overrides for straggler / NaN / bit-flip / crash injection points."""
    if inp.kind in LAUNCH_TIME_KINDS:
        return InjectFaultOutput(kind=inp.kind, injected_at=None, target=f"rank {inp.rank} at step {inp.step}",
                                 overrides=launch_overrides(inp),
                                 note="launch-time fault: start the run with these overrides; the trainer logs the step it fires")
    if inp.kind == "drain_node":
        from trainops.tools.schedulers import get_scheduler

        try:
            get_scheduler(inp.scheduler).drain(inp.node, "trainops fault drill")
        except SchedulerError as exc:
            raise ToolError("inject_fault", str(exc)) from None
        at = time.time()
        if inp.run:
            record_fault(_run_dir(inp.run), {"kind": inp.kind, "time": at, "node": inp.node})
        return InjectFaultOutput(kind=inp.kind, injected_at=at, target=f"node {inp.node}")
    run_dir = _run_dir(inp.run)
    if inp.kind == "corrupt_checkpoint":
        at, target = _corrupt_newest_checkpoint(run_dir)
        record_fault(run_dir, {"kind": inp.kind, "time": at, "file": target})
        return InjectFaultOutput(kind=inp.kind, injected_at=at, target=target)
    if inp.kind == "kill_node":
        from trainops.tools.monitoring.embedded import read_heartbeats

        node = inp.node or os.uname().nodename
        beats = read_heartbeats(run_dir)
        ranks = sorted(r for r, b in beats.items() if b.get("host", os.uname().nodename) == node and "pid" in b)
        if not ranks:
            raise ToolError("inject_fault", f"no rank of {run_dir} reports node {node!r} in its heartbeat; check the node name")
        pids = [int(beats[r]["pid"]) for r in ranks]
        at = _signal(pids, signal.SIGKILL)
        record_fault(run_dir, {"kind": inp.kind, "time": at, "node": node, "ranks": ranks, "pids": pids})
        return InjectFaultOutput(kind=inp.kind, injected_at=at, target=f"node {node} ranks {ranks}", pids=pids)
    pid = _rank_pid(run_dir, inp.rank)
    at = _signal([pid], signal.SIGKILL if inp.kind == "kill_rank" else signal.SIGSTOP)
    record_fault(run_dir, {"kind": inp.kind, "time": at, "rank": inp.rank, "pid": pid})
    note = f"the rank is stopped, not dead: `kill -CONT {pid}` resumes it, or cancel the job" if inp.kind == "hang" else ""
    return InjectFaultOutput(kind=inp.kind, injected_at=at, target=f"rank {inp.rank} pid {pid}", pids=[pid], note=note)
