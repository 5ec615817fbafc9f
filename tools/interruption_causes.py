"""What a job end shows (the evidence) and the cause it supports: gathered from the scheduler's
status, its node states and the run folder, then classified by rules over that evidence alone.
A drill's name is never read here: a drill's injected fault acts like the real one, and its
record must say what the evidence says, or "unclassified" with the evidence when it says nothing."""
from __future__ import annotations

import math
import re
import signal as _signal
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

Cause = Literal["hardware", "network", "software", "data", "planned", "unclassified"]
CAUSES: tuple[str, ...] = ("hardware", "network", "software", "data", "planned", "unclassified")

MAX_ERROR_LINES = 8
MAX_LINE_CHARS = 300
_NET = re.compile(r"connection (reset|refused|closed)|broken pipe|ECONNRESET|EPIPE|no route to host|"
                  r"network is unreachable|peer closed|socket timeout|gloo.*(timed out|timeout)|nccl.*(timeout|"
                  r"remote)|Timed out waiting|collective.*timed out", re.I)
_EXC = re.compile(r"^(Traceback \(most recent call last\)|[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b[:]?)")
_NODE_DOWN = {"down", "drained", "draining"}


class Evidence(BaseModel):
    """What the job end showed, each field as observed (None: not observed)."""

    state: str = Field("", description="The scheduler's terminal state.")
    reason: str = Field("", description="The scheduler's reason for it (Slurm's State/Reason, local exit).")
    exit_code: int | None = None
    signal: str | None = Field(None, description="The signal that ended the job (from a negative exit code, "
                                                 "128+N, or the scheduler).")
    failing_rank: int | None = None
    failing_node: str | None = None
    error_lines: list[str] = Field(default_factory=list, description="The last error lines the ranks and the "
                                   "run left (bounded, secrets scrubbed, control characters escaped).")
    heartbeat_age_s: dict[int, float] = Field(default_factory=dict,
                                              description="rank -> seconds from its last beat to the job end.")
    node_states: dict[str, str] = Field(default_factory=dict, description="node -> state after the end.")
    silent_ranks: list[int] = Field(default_factory=list, description="Ranks that left no exit note while others "
                                    "did: killed, not failed (their peers' errors are the consequence).")
    checksum_verdict: Literal["agree", "disagree"] | None = Field(
        None, description="Replica parameter checksums at the same step: agree or disagree.")
    checksum_detail: str = ""
    nonfinite_loss_step: int | None = Field(None, description="The data position (step) of the first NaN/inf loss.")
    nonfinite_repeats: bool | None = Field(None, description="The NaN/inf recurred at that step on replay "
                                                             "(a later launch); None: not replayed.")
    last_step: int | None = Field(None, description="The last step any rank completed.")
    last_progress_time: float | None = Field(None, description="Unix time of the last step or beat.")
    committed_step: int | None = Field(None, description="The last checkpoint committed before the end.")
    step_time_s: float | None = Field(None, description="Median step time, for the steps redone.")


def inert(text: object) -> str:
    """Run text made safe to keep: secrets scrubbed, control/bidi characters escaped, bounded."""
    from trainops.redact import scrub
    from trainops.terminal_text import visible

    return visible(scrub(str(text)))[:MAX_LINE_CHARS]


def _signal_of(exit_code: int | None) -> str | None:
    if exit_code is None:
        return None
    num = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code < 160 else None
    if num is None:
        return None
    try:
        return _signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _log_errors(name: str, text: str) -> list[str]:
    hits = [ln.strip() for ln in text.splitlines() if _EXC.match(ln.strip()) or _NET.search(ln)]
    return [f"{name}: {ln}" for ln in hits[-3:]]


def _error_lines(run_dir: Path, beats: dict, result) -> tuple[list[str], int | None]:
    """The error lines ranks noted on exit, the run's failure line and the tail of each rank log's
    errors; and the first rank that noted one."""
    from trainops.run_folder import RunFiles, read_regular

    lines, first = [], None
    for rank, beat in beats.items():
        if beat.exit is not None and beat.exit.error:
            lines.append(f"rank {rank}: {beat.exit.error}")
            first = rank if first is None else first
    if result is not None and result.failure:
        lines.append(result.failure)
    for path in sorted(RunFiles(run_dir).root.glob("logs/rank*.log"))[:64]:
        lines += _log_errors(path.stem, (read_regular(path, 4 << 20) or b"").decode(errors="replace"))
    return [inert(ln) for ln in dict.fromkeys(lines)][-MAX_ERROR_LINES:], first


def _metrics_evidence(run_dir: Path, ev: Evidence) -> None:
    """Checksums, the first non-finite loss and whether it repeated, the last step and its time."""
    import statistics

    from trainops.run_folder import read_journal, read_metrics

    records = read_metrics(run_dir)
    sums: dict[int, dict[str, set]] = {}
    seen_bad: dict[int, int] = {}
    for rec in records:
        if rec.param_checksum is not None:
            sums.setdefault(rec.step, {}).setdefault(rec.replica_group or "all", set()).add(rec.param_checksum)
        if rec.loss is not None and not math.isfinite(rec.loss) and rec.rank == 0:
            seen_bad[rec.step] = seen_bad.get(rec.step, 0) + 1
    odd = [(s, g) for s, groups in sorted(sums.items()) for g, vals in groups.items() if len(vals) > 1]
    if sums:
        ev.checksum_verdict = "disagree" if odd else "agree"
        ev.checksum_detail = inert(f"replica group {odd[0][1]} disagrees at step {odd[0][0]}") if odd else ""
    if seen_bad:
        step = min(seen_bad)
        ev.nonfinite_loss_step = step
        replayed = sum(1 for r in records if r.rank == 0 and r.step == step) > 1
        ev.nonfinite_repeats = (seen_bad[step] > 1) if replayed else None
    if records:
        ev.last_step = max(r.step for r in records)
        ev.last_progress_time = max(r.time for r in records) or None
        times = [r.step_time_s for r in records if r.step_time_s]
        ev.step_time_s = statistics.median(times) if times else None
    saves = [s.step for s in read_journal(run_dir).saves if getattr(s, "step", None) is not None]
    ev.committed_step = max(saves) if saves else None


def gather(status, node_states: dict[str, str] | None = None, job_log: str = "") -> Evidence:
    """The evidence of one job end: the scheduler's status, node states and job log, and the run folder."""
    from trainops.run_folder import read_heartbeats, read_status

    ev = Evidence(state=status.state, reason=inert(status.reason), exit_code=status.exit_code,
                  node_states={inert(k): inert(v) for k, v in (node_states or {}).items()})
    run_dir = Path(status.run_dir) if status.run_dir else None
    result = read_status(run_dir) if run_dir and run_dir.is_dir() else None
    if result is not None and ev.exit_code in (None, 0):
        ev.exit_code = result.exit_code
    ev.signal = _signal_of(ev.exit_code) or _reason_signal(status.reason)
    ev.error_lines = [inert(ln) for ln in _log_errors("job log", job_log)]
    if run_dir is None or not run_dir.is_dir():
        return ev
    beats = read_heartbeats(run_dir)
    end = status.ended_at or time.time()
    ev.heartbeat_age_s = {r: round(max(0.0, end - b.time), 3) for r, b in beats.items() if b.time}
    run_lines, ev.failing_rank = _error_lines(run_dir, beats, result)
    ev.error_lines = list(dict.fromkeys(run_lines + ev.error_lines))[-MAX_ERROR_LINES:]
    noted = {r for r, b in beats.items() if b.exit is not None}
    ev.silent_ranks = sorted(set(beats) - noted) if noted else []
    if ev.silent_ranks:
        ev.failing_rank = ev.silent_ranks[0]
    if ev.failing_rank is None and ev.heartbeat_age_s:
        ev.failing_rank = max(ev.heartbeat_age_s, key=ev.heartbeat_age_s.get)
    if ev.failing_rank is not None and ev.failing_rank in beats and beats[ev.failing_rank].host:
        ev.failing_node = inert(beats[ev.failing_rank].host)
    _metrics_evidence(run_dir, ev)
    if beats:
        last_beat = max(b.time for b in beats.values())
        ev.last_progress_time = max(ev.last_progress_time or 0.0, last_beat) or None
    return ev


def _reason_signal(reason: str) -> str | None:
    m = re.search(r"\b(SIG[A-Z]+)\b", reason or "")
    return m.group(1) if m else None


def classify(ev: Evidence, planned: bool = False) -> tuple[Cause, str]:
    """The cause the evidence supports and the evidence it used; "unclassified" says what was seen."""
    if planned:
        return "planned", f"ended by an operator ({ev.state}: {ev.reason or 'cancelled'})"
    if ev.checksum_verdict == "disagree":
        return "hardware", f"replica checksums disagree ({ev.checksum_detail}): suspected silent data corruption"
    down = {n: s for n, s in ev.node_states.items() if s.lower() in _NODE_DOWN}
    node_fail = re.search(r"NODE_FAIL|node.*(down|fail|lost|not responding)", ev.reason, re.I)
    if (down or node_fail) and (ev.signal in ("SIGKILL", None) or node_fail):
        nodes = ", ".join(f"{n} {s}" for n, s in down.items()) or ev.reason
        return "hardware", f"processes ended ({ev.signal or ev.state}) with the node down: {nodes}"
    if ev.nonfinite_loss_step is not None and ev.nonfinite_repeats:
        return "data", f"non-finite loss at data position step {ev.nonfinite_loss_step} repeats on replay"
    if ev.silent_ranks and not down:
        return "unclassified", (f"rank(s) {ev.silent_ranks} ended without a word (killed: {ev.signal or 'no signal'} "
                                f"seen) on live node(s) {ev.failing_node or 'unknown'}; their peers' errors follow "
                                "from it; nothing says what killed them")
    net = [ln for ln in ev.error_lines if _NET.search(ln)]
    if net and not down:
        return "network", f"connection failure between live nodes: {net[-1]}"
    exc = [ln for ln in ev.error_lines if _EXC.search(ln.split(": ", 1)[-1]) or "Error" in ln]
    if exc:
        where = f"rank {ev.failing_rank}" if ev.failing_rank is not None else "the trainer"
        return "software", f"a Python exception in {where}: {exc[-1]}"
    seen = [f"state {ev.state}", f"exit {ev.exit_code}" if ev.exit_code is not None else "no exit code"]
    if ev.signal:
        seen.append(f"signal {ev.signal}")
    if ev.nonfinite_loss_step is not None:
        seen.append(f"non-finite loss at step {ev.nonfinite_loss_step} "
                    f"({'not replayed' if ev.nonfinite_repeats is None else 'did not repeat on replay'})")
    if ev.heartbeat_age_s:
        seen.append(f"stalest heartbeat {max(ev.heartbeat_age_s.values()):.1f} s")
    return "unclassified", "no rule matched the evidence: " + "; ".join(seen)
