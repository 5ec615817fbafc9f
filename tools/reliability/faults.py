"""Fault injection for drills. Process faults (kill, hang) act only on the processes of the job
trainops launched for the run (tools/schedulers/processes.py), never on a pid a heartbeat or any
other file names; the checkpoint fault only on files inside the workspace. Numeric and slow-rank
faults go through the trainer's config-driven injection points, which must be set at launch (the
tool returns the `faults.*` overrides to launch with). Every injection is appended to
`RUN/faults.jsonl` with its exact wall time, so detection can report its latency."""
from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field, model_validator

from trainops.run_folder import RunFiles
from trainops.tools.base import ToolError, tool
from trainops.tools.ids import NodeName, RunRef
from trainops.tools.sandbox import cluster as sandbox
from trainops.tools.sandbox import faults as sandbox_faults
from trainops.tools.schedulers import get_scheduler
from trainops.tools.schedulers.base import SchedulerError, SchedulerKind
from trainops.tools.schedulers.processes import job_of_run, job_processes, node_of, rank_processes
from trainops.trainer.checkpoint_files import list_checkpoints
from trainops.workspace import confine, run_folder

FaultKind = Literal["kill_rank", "kill_node", "hang", "straggler", "nan", "bitflip", "crash", "corrupt_checkpoint",
                    "drain_node", "node_crash", "power_loss", "partition", "slow_network", "heal_node"]
LAUNCH_TIME_KINDS = {"straggler", "nan", "bitflip", "crash"}
NODE_KINDS = {"node_crash", "power_loss", "partition", "slow_network", "heal_node"}  # trainops sandbox nodes only


class InjectFaultInput(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    kind: FaultKind = Field(description="kill_rank (SIGKILL one rank), kill_node (SIGKILL every rank on a node), hang "
                                        "(SIGSTOP one rank), corrupt_checkpoint (damage the newest checkpoint), "
                                        "drain_node (through the scheduler); straggler, nan, bitflip, crash are "
                                        "trainer injection points set at launch: this returns the overrides to launch "
                                        "with. Node faults on a `trainops sandbox` node: node_crash (slurmd and every "
                                        "process on the node SIGKILLed), power_loss (link down, then the same), "
                                        "partition (link down, processes alive), slow_network (tbf rate limit on the "
                                        "node's link), heal_node (link up, no limit, slurmd restarted).")
    run: RunRef | None = Field(None,
                               description="Run id or run folder inside the workspace (needed for every kind except "
                                        "drain_node).")
    rank: int = Field(0, ge=0, le=1_048_575, description="Target rank (kill_rank, hang, straggler, bitflip, crash).")
    node: NodeName | None = Field(None,
                                  description="Target node (kill_node, drain_node); kill_node defaults to the node of "
                                         "`rank`.")
    step: int = Field(5, ge=0, le=1_000_000_000, description="Step at which a launch-time fault fires.")
    slow_ms: int = Field(200, ge=1, le=600_000, description="Extra milliseconds per step for a straggler.")
    scheduler: SchedulerKind = Field("local",
                                     description="Scheduler of the node to drain (drain_node); process faults find the "
                                                 "run's job on any scheduler.")
    rate_mbit: float = Field(1.0, ge=0.01, le=100_000, description="slow_network: the node link's rate, Mbit/s.")

    @model_validator(mode="after")
    def _targets(self) -> "InjectFaultInput":
        if self.kind not in LAUNCH_TIME_KINDS | NODE_KINDS and self.kind != "drain_node" and not self.run:
            raise ValueError(f"kind={self.kind} needs run (a run id or run folder) to find the target")
        if self.kind == "drain_node" and not self.node:
            raise ValueError("kind=drain_node needs node (the node name as the scheduler knows it)")
        if self.kind in NODE_KINDS and not (self.node or "").removeprefix("n").isdigit():
            raise ValueError(f"kind={self.kind} needs node: a sandbox node name such as n2")
        return self


class InjectFaultOutput(BaseModel):
    kind: FaultKind
    injected_at: float | None = Field(description="Exact wall time of the injection (Unix seconds); None for "
                                                  "launch-time faults, which fire at their step.")
    target: str = Field(description="What was hit: 'rank 1 pid 1234', a node, a checkpoint file.")
    pids: list[int] = Field(default_factory=list)
    overrides: list[str] = Field(default_factory=list,
                                 description="For launch-time faults: the faults.* overrides to launch the run with.")
    note: str = ""


def _run_dir(run: str) -> Path:
    try:
        return run_folder(run)
    except ValueError as exc:
        raise ToolError("inject_fault", str(exc)) from None


def _job_ranks(inp: InjectFaultInput, run_dir: Path) -> dict[int, psutil.Process]:
    """rank -> process of the job trainops launched for this run."""
    try:
        scheduler, job_id = job_of_run(run_dir)
        procs = job_processes(job_id, scheduler)
    except SchedulerError as exc:
        raise ToolError("inject_fault", str(exc)) from None
    return rank_processes(procs)


def _pick_rank(ranks: dict[int, psutil.Process], rank: int, run_dir: Path) -> psutil.Process:
    if rank not in ranks:
        have = ", ".join(str(r) for r in ranks) or "none running"
        raise ToolError("inject_fault",
                        f"rank {rank} is not a running process of the job for {run_dir} (ranks: {have}); "
                                        "wait for the job to start or pick a rank that exists")
    return ranks[rank]


def record_fault(run_dir: Path, entry: dict) -> None:
    """Append to RUN/faults.jsonl, never through a link the job put in its place."""
    try:
        fd = os.open(RunFiles(run_dir).faults, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise ToolError("inject_fault", f"cannot append to {run_dir / 'faults.jsonl'} ({exc.strerror}); it must be a "
                                        "plain file in the run folder: remove what is there") from None
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def _signal(procs: list[psutil.Process], sig: signal.Signals) -> float:
    """Signal each process; the injection's time, read before the first signal: a supervisor that sees
    the rank die at once must not appear to detect it before it was injected (on a loaded host this
    process may lose the CPU between the signal and a clock read after it). psutil checks each process
    is still the one found (same pid and create time) before it signals."""
    at = time.time()
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            raise ToolError("inject_fault", f"pid {proc.pid} is not running; the rank has already exited") from None
    return at


def _corrupt_newest_checkpoint(run_dir: Path) -> tuple[float, str]:
    """Flip bytes in the largest file of the newest committed checkpoint (an unfinished
    `step-N.tmp/` would be checksummed with the damage in it and committed as sound); every path
    is confined to the workspace (a symlinked checkpoint folder or file pointing elsewhere is
    refused) and the file is opened without following a link."""
    try:
        folder = confine(run_dir / "checkpoints", "checkpoint folder")
        ckpts = [confine(Path(c.path), "checkpoint") for c in list_checkpoints(folder) if c.committed]
        if not ckpts:
            raise ToolError("inject_fault", f"no committed checkpoint under {folder}; run with "
                                            "checkpoint.enable=true and wait for a save to commit")
        files = sorted((confine(p, "checkpoint file") for p in ckpts[-1].rglob("*") if p.is_file()
                        and p.stat().st_size > 0),
                       key=lambda p: p.stat().st_size)
    except ValueError as exc:
        raise ToolError("inject_fault", str(exc)) from None
    if not files:
        raise ToolError("inject_fault", f"checkpoint {ckpts[-1]} has no data files to corrupt")
    target = files[-1]
    fd = os.open(target, os.O_RDWR | os.O_NOFOLLOW)
    with os.fdopen(fd, "r+b") as fh:
        middle = os.fstat(fd).st_size // 2
        fh.seek(middle)
        chunk = fh.read(64)
        fh.seek(middle)
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
                                 note="launch-time fault: start the run with these overrides; the trainer logs the "
                                      "step it fires")
    if inp.kind in NODE_KINDS:
        return _node_fault(inp)
    if inp.kind == "drain_node":
        run_dir = _run_dir(inp.run) if inp.run else None
        try:
            get_scheduler(inp.scheduler).drain(inp.node, "trainops fault drill")
        except SchedulerError as exc:
            raise ToolError("inject_fault", str(exc)) from None
        at = time.time()
        if run_dir:
            record_fault(run_dir, {"kind": inp.kind, "time": at, "node": inp.node})
        return InjectFaultOutput(kind=inp.kind, injected_at=at, target=f"node {inp.node}")
    run_dir = _run_dir(inp.run)
    if inp.kind == "corrupt_checkpoint":
        at, target = _corrupt_newest_checkpoint(run_dir)
        record_fault(run_dir, {"kind": inp.kind, "time": at, "file": target})
        return InjectFaultOutput(kind=inp.kind, injected_at=at, target=target)
    if inp.kind == "kill_node":
        every_rank = _job_ranks(inp, run_dir)
        node = node_of(_pick_rank(every_rank, inp.rank, run_dir)) if inp.node is None else inp.node
        node = socket.gethostname() if node == "localhost" else node
        ranks = {r: proc for r, proc in every_rank.items() if node_of(proc) == node}
        if not ranks:
            raise ToolError("inject_fault",
                            f"no running rank of the job for {run_dir} is on node {node!r}; check the node name")
        pids = [proc.pid for proc in ranks.values()]
        # a node takes its ranks at once: each is frozen before any dies, so none outlives a peer long
        # enough to see its socket close and note an exit (seen on a loaded 2-core CI machine)
        at = _signal(list(ranks.values()), signal.SIGSTOP)
        _signal(list(ranks.values()), signal.SIGKILL)
        record_fault(run_dir, {"kind": inp.kind, "time": at, "node": node, "ranks": list(ranks), "pids": pids})
        return InjectFaultOutput(kind=inp.kind, injected_at=at, target=f"node {node} ranks {list(ranks)}", pids=pids)
    proc = _pick_rank(_job_ranks(inp, run_dir), inp.rank, run_dir)
    at = _signal([proc], signal.SIGKILL if inp.kind == "kill_rank" else signal.SIGSTOP)
    record_fault(run_dir, {"kind": inp.kind, "time": at, "rank": inp.rank, "pid": proc.pid})
    note = (f"the rank is stopped, not dead: `kill -CONT {proc.pid}` resumes it, or cancel the job"
            if inp.kind == "hang" else "")
    return InjectFaultOutput(kind=inp.kind, injected_at=at, target=f"rank {inp.rank} pid {proc.pid}", pids=[proc.pid],
                             note=note)


def _node_fault(inp: InjectFaultInput) -> InjectFaultOutput:
    """A real node or network fault, only on a node of the `trainops sandbox` that SLURM_CONF names:
    trainops acts on namespaces it made itself, never on a host it did not."""
    state = sandbox.state_for_slurm_conf(os.environ.get("SLURM_CONF", ""))
    if state is None:
        raise ToolError("inject_fault", f"kind={inp.kind} acts on trainops sandbox nodes only, and SLURM_CONF "
                                        f"({os.environ.get('SLURM_CONF', 'unset')}) is not a sandbox's; start one with "
                                        "`trainops sandbox up` and export the SLURM_CONF it prints")
    node, prefix = int(inp.node.removeprefix("n")), state.spec.prefix
    pids: list[int] = []
    try:
        if inp.kind in ("node_crash", "power_loss"):
            pids = sandbox_faults.crash_node(node, power_loss=inp.kind == "power_loss", prefix=prefix)
        elif inp.kind == "partition":
            sandbox_faults.set_link(node, False, prefix=prefix)
        elif inp.kind == "slow_network":
            sandbox_faults.slow_link(node, inp.rate_mbit, prefix=prefix)
        else:
            sandbox_faults.heal_node(node, prefix=prefix)
    except sandbox.SandboxError as exc:
        raise ToolError("inject_fault", str(exc)) from None
    at = time.time()
    if inp.run:
        record_fault(_run_dir(inp.run), {"kind": inp.kind, "time": at, "node": inp.node, "pids": pids,
                                         **({"rate_mbit": inp.rate_mbit} if inp.kind == "slow_network" else {})})
    return InjectFaultOutput(kind=inp.kind, injected_at=at, target=f"sandbox node {inp.node}", pids=pids)
