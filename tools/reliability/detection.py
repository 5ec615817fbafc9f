"""The `detect_faults` tool: poll a run (and its job) until something is wrong, and say what,
how it was seen, how long after the injection, and how much to isolate. The signals, thresholds
and checks it asks each poll are in tools/reliability/signals.py; given the injection (its kind named,
or read from RUN/faults.jsonl), only the fault's own signal counts as its detection, and the
watch goes on past a false positive until that signal shows."""
from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, Field

from trainops.run_folder import RunFiles
from trainops.run_records import read_faults, read_heartbeats, read_recoveries, read_status
from trainops.tools.base import ToolError, tool
from trainops.tools.ids import RunRef
from trainops.tools.reliability.evidence import inert
from trainops.tools.reliability.signals import ISOLATION, DetectFaultsInput, Detection, FaultWatch
from trainops.tools.schedulers import get_scheduler
from trainops.tools.schedulers.base import TERMINAL_STATES, SchedulerError
from trainops.workspace import run_folder

# Ranks append their records of one step microseconds to milliseconds apart; a loss anomaly is held
# this long (at most) for the peers' records of its step, whose checksums may name a corrupted replica.
PEER_RECORD_WAIT_S = 1.0


def _latest_injection(run_dir: Path) -> tuple[float | None, str | None]:
    faults = read_faults(run_dir)
    return (faults[-1].time, faults[-1].kind) if faults else (None, None)


def _finished_ok(run_dir: Path) -> bool:
    """The launcher writes status.json at the end; a clean finish is not a fault."""
    status = read_status(run_dir)
    return status is not None and status.status == "ok"


def _job_ended(inp: DetectFaultsInput, st, run_dir: Path, since: float) -> str | None:
    """Why the job ended, in its own words: a terminal scheduler state, or a failed launch's status.json
    written since `since` (the injection) when no job is named."""
    try:  # not tools/follow's reader: that module calls tools, and the tool registry imports this one
        result = read_status(run_dir) if RunFiles(run_dir).status.stat().st_mtime >= since else None
    except OSError:
        result = None
    if st is not None and st.state in TERMINAL_STATES:
        return f"job {inp.job_id} is {st.state} (exit code {st.exit_code}; {st.reason})" + (
            f"; status.json: {result.failure}" if result is not None and result.failure else "")
    if result is not None and result.status == "failed":
        return f"run {inp.run} failed (exit code {result.exit_code}): {result.failure} (its status.json)"
    return None


def _finish(watch: FaultWatch, mechanism: str, rank, node, step, evidence, injected_at, polls,
            detected_at: float | None = None) -> Detection:
    now = time.time() if detected_at is None else detected_at
    isolation, recommendation = ISOLATION[mechanism]
    return watch.result(detected=True, mechanism=mechanism, rank=rank, node=node, step=step, detected_at=now,
                        injected_at=injected_at, detection_latency_s=None if injected_at is None else now - injected_at,
                        isolation=isolation, recommendation=recommendation, evidence=evidence, polls=polls)


def _recovered_in_process(run_dir: Path, since: float) -> tuple[int, str | None, str, float] | None:
    """A lost rank the job's in-process supervisor (its ranks' parent, or their node's agent) already
    detected and replaced since `since`: (rank, node, why, when it was detected). The survivors
    keep their processes and a spare beats in the lost rank's place, so neither an exit note nor a
    stale heartbeat may ever show."""
    entry = next((e for e in read_recoveries(run_dir) if e.path != "requeue" and e.time - e.total_s >= since), None)
    if entry is None or not entry.lost:
        return None
    lost = entry.lost[0]
    return (lost.rank, lost.host or (entry.lost_nodes[0] if entry.lost_nodes else None),
            f"the job's supervisor replaced rank(s) {entry.failed_ranks}: {entry.trigger}"[:600],
            entry.time - entry.total_s)


@tool("detect_faults", risk="read", tags=("faults", "drill"))
def detect_faults(inp: DetectFaultsInput) -> Detection:
    """Watch a run until a fault shows (a rank exits, a heartbeat goes stale, loss or grad norm
    turns NaN or jumps, replica checksums disagree, a rank straggles) or the timeout passes.
    Reports the mechanism, the rank and node, the detection latency from the injection, and
    the isolation to apply (rank, node, replica group or job)."""
    try:
        run_dir = run_folder(inp.run)
    except ValueError as exc:
        raise ToolError("detect_faults", str(exc)) from None
    sched = None
    if inp.job_id:
        sched = get_scheduler(inp.scheduler)
    watch, started = FaultWatch(inp, run_dir), time.time()
    host = os.uname().nodename
    held, held_since = None, 0.0  # a loss anomaly waiting for every rank's record of its step
    deadline = time.monotonic() + inp.timeout_s
    polls = 0
    while True:
        polls += 1
        injected_at, kind = _latest_injection(run_dir)
        injected_at = inp.injected_at if inp.injected_at is not None else injected_at
        watch.expect(inp.fault_kind or kind, injected_at)
        st = None
        if sched is not None:
            try:
                st = sched.status(inp.job_id)
            except SchedulerError as exc:
                raise ToolError("detect_faults", str(exc)) from None
        if (st is not None and st.state == "completed") or _finished_ok(run_dir):
            return watch.result(detected=False, evidence=f"run {inp.run} finished cleanly with no fault seen",
                                polls=polls, injected_at=injected_at)
        records = watch.ingest()
        if held is None:
            anomaly = watch.loss_anomaly(records)
            held, held_since = ((*anomaly, "loss_anomaly"), time.monotonic()) if anomaly else (None, 0.0)
        # a corrupted replica explains the loss anomaly it causes: the earlier step wins, the checksum on a tie
        findings = [(rec, why, "checksum_mismatch") for rec, why in filter(None, [watch.checksum_mismatch()])]
        findings += [held] if held else []
        if findings:
            rec, why, mechanism = min(findings, key=lambda f: f[0].step)
            if (mechanism == "loss_anomaly" and not watch.every_rank_reached(rec.step)
                    and time.monotonic() - held_since < min(PEER_RECORD_WAIT_S, inp.heartbeat_stale_s)):
                time.sleep(inp.poll_interval_s)  # a peer's checksum of this step may yet explain the anomaly
                continue
            node = (rec.host or host) if mechanism == "checksum_mismatch" else None
            if watch.counts(mechanism, rec.rank, rec.step, why):
                return _finish(watch, mechanism, rec.rank, node, rec.step, why, injected_at or rec.time, polls)
            held = None if mechanism == "loss_anomaly" else held
        if (found := _recovered_in_process(run_dir, injected_at or started)) is not None:
            rank, node, why, detected_at = found
            if watch.counts("process_exit", rank, None, why):
                return _finish(watch, "process_exit", rank, node, None, why, injected_at, polls, detected_at)
        dead = watch.stale_or_dead()
        if dead:
            mechanism, rank, beat, why = dead
            if watch.counts(mechanism, rank, beat.step, why):
                return _finish(watch, mechanism, rank, beat.host or host, beat.step, why, injected_at, polls)
        ended = _job_ended(inp, st, run_dir, injected_at or started)
        if ended and watch.counts("process_exit", None, None, ended):
            node = st.nodes[0] if st is not None and st.nodes else None
            return _finish(watch, "process_exit", None, node, None, ended, injected_at, polls)
        slow = watch.slow_node()  # before the straggler check: a slow link skews the ranks' step times too
        if slow and watch.counts("slow_link", slow[0], slow[1].step, slow[2]):
            rank, beat, why = slow
            return _finish(watch, "slow_link", rank, beat.host, beat.step, why, injected_at, polls)
        found = watch.straggler()
        if found and watch.counts("step_time_outlier", found[0].rank, found[0].step, found[1]):
            rec, why = found
            return _finish(watch, "step_time_outlier", rec.rank, rec.host or host, rec.step, why, injected_at, polls)
        if ended:  # the job is gone and its fault's own signal never showed: no point watching on
            return watch.result(detected=False, evidence=f"{ended}, without the signal its fault produces "
                                f"({', '.join(watch.expected)})", polls=polls, injected_at=injected_at)
        if time.monotonic() >= deadline:
            return watch.result(detected=False, evidence=f"nothing abnormal in {inp.timeout_s}s of watching {run_dir}",
                                polls=polls, injected_at=injected_at)
        time.sleep(inp.poll_interval_s)


class FindStragglerInput(BaseModel):
    run: RunRef = Field(description="Run id or run folder (inside the workspace).")
    straggler_ratio: float = Field(1.5, gt=1, le=1e6, description="How far the suspect's median must sit from its "
                                                                   "peers' (detect_faults' threshold).")
    window_steps: int = Field(8, ge=3, le=100_000, description="The newest steps each rank's median is taken over.")


class StragglerFinding(BaseModel):
    run: str
    field: str = Field(description="compute_time_s where every rank times its compute, else step_time_s.")
    rank_medians_s: dict[int, float] = Field(description="Each rank's median of that field over the window.")
    straggler: int | None = Field(description="The straggling rank; None when no rank stands out.")
    node: str | None = Field(description="The straggler's node, from its heartbeat.")
    reason: str
    not_read: str = Field("", description="What of metrics.jsonl was left unread (its older part, past the read "
                                          "caps): the medians are of the newest records; empty when all was read.")


@tool("find_straggler", risk="read", tags=("metrics",))
def find_straggler(inp: FindStragglerInput) -> StragglerFinding:
    """Which rank of a run is the straggler, judged from its metrics as detect_faults judges a live
    one: the slowest compute where ranks time it; else, since a synchronous job's peers wait for a
    late rank inside their own step timers, the rank with the shortest timed step."""
    try:
        run_dir = run_folder(inp.run)
    except ValueError as exc:
        raise ToolError("find_straggler", str(exc)) from None
    watch = FaultWatch(DetectFaultsInput(run=inp.run, straggler_ratio=inp.straggler_ratio,
                                         window_steps=inp.window_steps), run_dir)
    watch.ingest()
    if len(watch.by_rank) < 2:
        raise ToolError("find_straggler", f"{run_dir.name} has metrics of {len(watch.by_rank)} rank(s): a straggler "
                                          "needs peers to be slow against")
    field, medians, _ = watch.rank_medians()
    medians = {r: round(m, 6) for r, m in medians.items()}
    found = watch.straggler()
    if found is None:
        return StragglerFinding(run=run_dir.name, field=field, rank_medians_s=medians, straggler=None, node=None,
                                reason=f"no rank's median {field} stands {inp.straggler_ratio:g}x apart from its "
                                       "peers' over the window", not_read=watch.cut)
    record, why = found
    beat = read_heartbeats(run_dir).get(record.rank)
    return StragglerFinding(run=run_dir.name, field=field, rank_medians_s=medians, straggler=record.rank,
                            node=inert(record.host or (beat.host if beat else None) or "") or None, reason=why,
                            not_read=watch.cut)
