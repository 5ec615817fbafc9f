"""What a job end shows: gathered from the scheduler's status, its node states, the job log, the
kernel log and the run folder (and, just before trainops ends a job itself, each rank's process).
The cause it supports is tools/reliability/causes.py's; nothing here judges. A drill's name and the
faults.jsonl kind are never read: a drill's injected fault leaves the evidence the real one would."""
from __future__ import annotations

import math
import os
import re
import signal as _signal
import statistics
import time
from pathlib import Path
from typing import Literal

import psutil
from pydantic import BaseModel, Field

from trainops.redact import scrub
from trainops.run_folder import RunFiles, read_tail, this_launch
from trainops.run_records import metrics_since, read_heartbeats, read_journal, read_metrics, read_status
from trainops.terminal_text import visible
from trainops.tools.reliability.oom_advice import recipe_of
from trainops.tools.reliability.sdc_check import KNOWN_ANSWER_FAILED
from trainops.tools.reliability.signature_match import (
    TRUST_SPECIFICITY,
    SignatureHit,
    framework_of,
    match_lines,
    missing_ranks,
    named_cause,
    ranked,
    split_lines,
    waiting_ranks,
)
from trainops.tools.schedulers.processes import job_processes, rank_processes

MAX_ERROR_LINES = 8
RANK_LOG_BYTES = 4 << 20
MAX_LINE_CHARS = 300
NETWORK_ERROR = re.compile(r"connection (reset|refused|closed)|broken pipe|ECONNRESET|EPIPE|no route to host|"
                           r"network is unreachable|peer closed|ncclRemoteError|remote process exited", re.I)
"""A connection failure between ranks; a timeout is not one (a hung or slow peer, unless network evidence)."""
TIMEOUT_LINE = re.compile(r"socket timeout|gloo.*(timed out|timeout)|nccl.*timeout|Timed out waiting|"
                          r"collective.*timed out", re.I)
"""A timeout line, kept among a log's error lines (its cause is the signatures', never 'network' from it)."""
EXCEPTION_LINE = re.compile(r"^(Traceback \(most recent call last\)|[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b[:]?)")
NODE_DOWN = re.compile(r"down|drain|not.?responding|\*$|fail", re.I)  # Slurm's '*' suffix: not responding
_OOM = re.compile(r"(Out of memory|oom-kill|Memory cgroup out of memory).*?(?:Killed process |pid=)(\d+)", re.I)
_TORCHRUN_RANK = re.compile(r"rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_TORCHRUN_TEARDOWN = re.compile(r"Sending process \d+ closing signal SIGTERM")
"""torchrun's line as it stops the ranks still running once one has failed."""
KERNEL_LOG = "/dev/kmsg"
IN_PROCESS_STATE = "RECOVERED_IN_PROCESS"
"""The state of an in-process recovery's evidence: the job went on, a rank was replaced."""


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
    rank_nodes: dict[int, str] = Field(default_factory=dict, description="rank -> its node: one the scheduler "
                                       "allocated the job (its heartbeat's host only where it names one of those).")
    noted_ranks: list[int] = Field(default_factory=list, description="Ranks that noted their exit (an error, or "
                                   "the SIGTERM of their launcher) in their heartbeat.")
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
    ranks_at_end: dict[int, str] = Field(default_factory=dict, description="rank -> its process as trainops saw it "
                                         "just before ending the job itself: running, stopped or gone.")
    rank_exit_codes: dict[int, int] = Field(default_factory=dict, description="rank -> exit code, from the "
                                            "launcher's failure report in the job log.")
    torn_down_ranks: list[int] = Field(default_factory=list, description="Ranks the launcher itself stopped "
                                       "with SIGTERM after a peer failed (torchrun's teardown): alive at the end, "
                                       "not lost.")
    oom_kills: list[str] = Field(default_factory=list, description="Kernel log lines of the OOM killer ending a "
                                 "rank's pid.")
    kernel_log_read: bool = Field(False, description="The kernel log could be read for OOM kills.")
    replay: str = Field("", description="What a later launch of the same run showed at the NaN/inf step.")
    corrupt_checkpoints: list[int] = Field(default_factory=list, description="Committed checkpoints that failed "
                                           "verification when the restart loaded them.")
    signatures: list[SignatureHit] = Field(default_factory=list, description="Lines of the job's and ranks' logs "
                                           "that declared failure signatures matched, most specific first "
                                           "(tools/reliability/signatures.py).")
    framework: str | None = Field(None, description="The framework the log's own markers name, as a reason reads it.")
    failing_device: int | None = Field(None, description="The local device the most specific line names "
                                                         "(GPU N, cuda:N, torchrun's [defaultN], NCCL's [N]).")
    timeout_ranks: list[int] = Field(default_factory=list, description="The ranks whose lines report a collective "
                                     "timeout (every matching line, not only the ranked ones).")
    world_size: int | None = Field(None, description="The job's ranks, where known (its heartbeats, its spec): "
                                   "without it no missing rank is inferred from which ranks reported a timeout.")
    requeued: bool = Field(False, description="The scheduler requeued the job after this end (its accounting): it "
                           "ran again, so a requeue is done, not one to order.")
    stopped_doing: dict[int, str] = Field(default_factory=dict, description="rank -> what it was doing (its "
                                          "innermost frames) when its launcher or scheduler stopped it, as it "
                                          "noted on its way out.")
    recipe: dict[str, int | str] = Field(default_factory=dict, description="The run's batch recipe from its "
                                         "config.toml (oom_advice.recipe_of: bounded; empty without a run folder).")
    not_taken: list[str] = Field(default_factory=list, description="What the job wrote that was not taken as "
                                 "written: a figure outside the job's wall clock (the value seen, what was used), "
                                 "or a file's older part past the read caps (tools/reliability/job_numbers.py).")


def inert(text: object, limit: int = MAX_LINE_CHARS) -> str:
    """Run text made safe to keep: secrets scrubbed, control/bidi characters escaped, bounded."""
    return visible(scrub(str(text)))[:limit]


STALER_BY_S = 1.0
"""A rank rewrites its heartbeat every step: one whose beat is this much older than every other
rank's stopped first; ranks within it stopped together (a cancel), and none of them is named."""


def _clearly_stalest(ages: dict[int, float]) -> int | None:
    if len(ages) == 1:
        return next(iter(ages))
    ranked = sorted(ages, key=ages.get, reverse=True)
    if len(ranked) < 2 or ages[ranked[0]] - ages[ranked[1]] < STALER_BY_S:
        return None
    return ranked[0]


def _place_on_a_down_node(ev: Evidence) -> None:
    """No rank stopped first, but the scheduler marks exactly one of the job's nodes down or not
    responding (a partition: its ranks still ran; or a launch a requeue ended, whose heartbeats the
    next launch rewrote): that node is the failing one, and its rank when it held one rank."""
    if ev.failing_node is not None:
        return
    nodes = set(ev.rank_nodes.values()) or set(ev.node_states)  # no beat of this launch left: its nodes
    down = sorted({n for n in nodes if NODE_DOWN.search(ev.node_states.get(n, ""))})
    if len(down) != 1:
        return
    ev.failing_node = down[0]
    on_it = [r for r, n in ev.rank_nodes.items() if n == down[0]]
    if ev.failing_rank is None and len(on_it) == 1:
        ev.failing_rank = on_it[0]


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
    hits = [ln.strip() for ln in text.splitlines()
            if EXCEPTION_LINE.match(ln.strip()) or NETWORK_ERROR.search(ln) or TIMEOUT_LINE.search(ln)
            or KNOWN_ANSWER_FAILED in ln]
    return [f"{name}: {ln}" for ln in hits[-3:]]


def _failed_itself(note) -> bool:
    """A rank's exit note is a failure of its own: not its launcher's stop (a teardown), not a
    collective that timed out waiting for a peer (the peer is the one that failed)."""
    return note.stopped_by is None and not any(h.cause == "hung-peer" for h in match_lines([note.error]))


def _error_lines(run_dir: Path, beats: dict, result, until: float | None) -> tuple[list[str], int | None]:
    """The error lines ranks noted on exit, the run's failure line and the tail of each rank log's
    errors in the launch that ended by `until`; and the first rank that noted a failure of its own."""
    lines, first = [], None
    for rank, beat in beats.items():
        if beat.exit is not None and beat.exit.error:
            lines.append(f"rank {rank}: {beat.exit.error}")
            first = rank if first is None and _failed_itself(beat.exit) else first
    if result is not None and result.failure:
        lines.append(result.failure)
    for path in sorted(RunFiles(run_dir).root.glob("logs/rank*.log"))[:64]:
        lines += _log_errors(path.stem, this_launch(_rank_log_tail(path), until))
    return [inert(ln) for ln in dict.fromkeys(lines)][-MAX_ERROR_LINES:], first


def _rank_log_texts(run_dir: Path, until: float | None) -> list[str]:
    return [this_launch(_rank_log_tail(path), until)
            for path in sorted(RunFiles(run_dir).root.glob("logs/rank*.log"))[:64]]


def _rank_log_tail(path: Path) -> str:
    """A rank log's newest RANK_LOG_BYTES: a long log still shows how it ended ("" for a FIFO or device)."""
    read = read_tail(path, RANK_LOG_BYTES)
    return read[0].decode(errors="replace") if read else ""


def _signature_evidence(ev: Evidence, texts: list[str]) -> None:
    """The declared signatures the logs match, the framework they name, and the rank and device the
    most specific line's prefixes name where trainops' own record named none. For a collective timeout
    the failing rank is the one that did not arrive (a rank below the waiting ones that reported none)."""
    every = match_lines([ln for text in texts for ln in split_lines(text)], clean=inert)
    ev.signatures = ranked(every)
    ev.timeout_ranks = waiting_ranks(every)  # from every hit: ranked() keeps one line per signature
    ev.framework = framework_of("\n".join(texts))
    trusted = [h for h in ev.signatures if h.specificity >= TRUST_SPECIFICITY]
    if not trusted:
        return
    top = named_cause(trusted) or trusted[0]
    if ev.failing_rank is None:
        missing = missing_ranks(reported_timeout(ev), ev.world_size, ev.torn_down_ranks) \
            if top.cause == "hung-peer" else []
        ev.failing_rank = missing[0] if len(missing) == 1 else top.rank if top.cause != "hung-peer" else None
    if ev.failing_device is None and top.cause != "hung-peer":
        ev.failing_device = top.device


def reported_timeout(ev: Evidence) -> list[int]:
    """The ranks that reported a collective timeout: they arrived and waited."""
    return sorted(set(ev.timeout_ranks) | set(waiting_ranks(ev.signatures)))


def _launcher_exits(job_log: str) -> dict[int, int]:
    """rank -> exit code from torchrun's failure report ("rank : 1 ... exitcode : -9")."""
    out = {}
    for block in re.split(r"\n\s*\[\d+\]:\s*\n|Root Cause|Failures:", job_log or ""):
        if (m := _TORCHRUN_RANK.search(block)) is not None:
            out[int(m.group(1))] = int(m.group(2))
    return out


def kernel_oom_kills(pids: set[int], path: str = KERNEL_LOG, max_records: int = 50_000) -> tuple[bool, list[str]]:
    """(the kernel log was readable, its OOM-killer lines that name one of `pids`)."""
    if not pids:
        return False, []
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False, []
    hits = []
    try:
        for _ in range(max_records):
            try:
                rec = os.read(fd, 8192).decode(errors="replace")
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record overwritten while reading; go on
                continue
            if not rec:
                break
            msg = rec.split(";", 1)[-1].strip()
            if (m := _OOM.search(msg)) is not None and int(m.group(2)) in pids:
                hits.append(inert(msg))
    finally:
        os.close(fd)
    return True, hits[-3:]


def witness_ranks(run_dir: str | Path, job_id: str, scheduler: str) -> dict[int, str]:
    """rank -> its process now (running, stopped, gone), for a job trainops is about to end itself;
    {} when no process of the job is visible from here (another host): nothing was seen."""
    try:
        procs = job_processes(job_id, scheduler)
    except Exception:  # noqa: BLE001 - a scheduler that cannot be asked leaves this evidence out
        return {}
    if not procs:
        return {}
    ranks = rank_processes(procs)
    seen = {}
    for rank in sorted(set(read_heartbeats(run_dir)) | set(ranks)):
        proc = ranks.get(rank)
        try:
            status = proc.status() if proc is not None else psutil.STATUS_DEAD
        except psutil.Error:
            status = psutil.STATUS_DEAD
        seen[rank] = ("stopped" if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP)
                      else "gone" if status in (psutil.STATUS_DEAD, psutil.STATUS_ZOMBIE) else "running")
    return seen


def replay_evidence(ev: Evidence, run_dir: str | Path, after: float) -> None:
    """What a later launch of the same run showed: whether the NaN/inf step recurred when it was
    replayed, and the committed checkpoints that failed verification as the restart loaded them."""
    if ev.nonfinite_loss_step is not None and not ev.nonfinite_repeats:
        step = ev.nonfinite_loss_step
        again = [r for r in read_metrics(run_dir) if r.rank == 0 and r.step == step and r.time > after]
        if again:
            ev.nonfinite_repeats = any(r.loss is not None and not math.isfinite(r.loss) for r in again)
            ev.replay = (f"a later launch replayed step {step}: loss "
                         f"{'non-finite again' if ev.nonfinite_repeats else f'{again[0].loss:.4g}, finite'}")
    ev.corrupt_checkpoints = sorted({e.step for e in read_journal(run_dir).fallbacks if e.time > after}
                                    | set(ev.corrupt_checkpoints))


def _metrics_evidence(run_dir: Path, ev: Evidence, until: float | None = None) -> None:
    """Checksums, the first non-finite loss and whether it repeated, the last step and its time (of
    the records and checkpoints up to `until`, when given)."""
    read = metrics_since(run_dir)
    records = [r for r in read.records if until is None or r.time <= until]
    ev.not_taken += [read.cut] if read.cut else []
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
    saves = [s.step for s in read_journal(run_dir).saves
             if getattr(s, "step", None) is not None and (until is None or s.time <= until)]
    ev.committed_step = max(saves) if saves else None


def gather(status, node_states: dict[str, str] | None = None, job_log: str = "",
           ranks_at_end: dict[int, str] | None = None, beats: dict | None = None,
           until: float | None = None) -> Evidence:
    """The evidence of one job end: the scheduler's status, node states and job log, the ranks'
    processes and heartbeats as seen just before trainops ended the job (if it did), the kernel log
    and the run folder up to `until` (default: the end). A later launch of the same run rewrites the
    heartbeats and appends steps, so nothing newer than that is this end's evidence."""
    if until is None and status.ended_at:
        until = status.ended_at + 1.0  # a scheduler's end time may be whole seconds
    job_log = this_launch(job_log or "", until)
    ev = Evidence(state=status.state, reason=inert(status.reason), exit_code=status.exit_code, requeued=status.requeued,
                  node_states={inert(k): inert(v) for k, v in (node_states or {}).items()},
                  ranks_at_end=dict(ranks_at_end or {}), rank_exit_codes=_launcher_exits(job_log))
    ev.world_size = getattr(status, "ranks", None)
    if _TORCHRUN_TEARDOWN.search(job_log):
        ev.torn_down_ranks = sorted(r for r, code in ev.rank_exit_codes.items() if code == -_signal.SIGTERM)
    run_dir = Path(status.run_dir) if status.run_dir else None
    result = read_status(run_dir) if run_dir and run_dir.is_dir() else None
    if result is not None and ev.exit_code in (None, 0):
        ev.exit_code = result.exit_code
    ev.signal = _signal_of(ev.exit_code) or _reason_signal(status.reason)
    ev.error_lines = [inert(ln) for ln in _log_errors("job log", job_log)]
    if run_dir is None or not run_dir.is_dir():
        _signature_evidence(ev, [job_log])
        return ev
    end = status.ended_at or time.time()
    if beats is None:
        beats = {r: b for r, b in read_heartbeats(run_dir).items() if until is None or b.time <= until}
    ev.heartbeat_age_s = {r: round(max(0.0, end - b.time), 3) for r, b in beats.items() if b.time}
    if ev.world_size is None and beats and set(beats) == set(range(len(beats))):  # every rank 0..n-1 beat
        ev.world_size = len(beats)
    run_lines, ev.failing_rank = _error_lines(run_dir, beats, result, until)
    ev.error_lines = list(dict.fromkeys(run_lines + ev.error_lines))[-MAX_ERROR_LINES:]
    noted = {r for r, b in beats.items() if b.exit is not None}
    ev.noted_ranks = sorted(noted)
    ev.stopped_doing = {r: inert(b.exit.where) for r, b in beats.items()
                        if b.exit and b.exit.stopped_by and b.exit.where}
    ev.rank_nodes = _rank_nodes(ev, beats, [inert(n) for n in status.nodes])
    ev.silent_ranks = sorted(set(beats) - noted) if noted else []
    gone = [r for r, st in ev.ranks_at_end.items() if st == "stopped" or (st == "gone" and r not in noted)]
    ev.failing_rank = next(iter(gone or ev.silent_ranks), ev.failing_rank)
    if ev.failing_rank is None:
        ev.failing_rank = _clearly_stalest(ev.heartbeat_age_s)
    if ev.failing_rank is not None:
        ev.failing_node = ev.rank_nodes.get(ev.failing_rank)
    _place_on_a_down_node(ev)
    _signature_evidence(ev, [job_log, *_rank_log_texts(run_dir, until)])
    ev.recipe = recipe_of(run_dir)
    ev.kernel_log_read, ev.oom_kills = kernel_oom_kills({b.pid for b in beats.values() if b.pid})
    _metrics_evidence(run_dir, ev, until)
    if beats:
        last_beat = max(b.time for b in beats.values())
        ev.last_progress_time = max(ev.last_progress_time or 0.0, last_beat) or None
    return ev


def _rank_nodes(ev: Evidence, beats: dict, allocated: list[str]) -> dict[int, str]:
    """rank -> node, from the scheduler's allocation: on a one-node job every rank ran there; across
    nodes a heartbeat's host counts only where it is one of the allocated nodes. A host the job named
    outside its allocation is quoted in `not_taken`, never a node of the record."""
    claims = {r: inert(b.host) for r, b in beats.items() if b.host}
    for rank, host in claims.items():
        if host not in allocated:
            ev.not_taken.append(inert(f"rank {rank}'s heartbeat names host {host!r}, not a node the scheduler "
                                      f"allocated the job ({', '.join(allocated) or 'none known'}): quoted, not used"))
    if len(allocated) == 1:
        return dict.fromkeys(beats, allocated[0])
    return {r: host for r, host in claims.items() if host in allocated}


def gather_in_process(entry, run_dir: str | Path) -> Evidence:
    """The evidence of an in-process recovery (a trainops.run_records.RecoveryEntry): the replaced ranks
    as the supervisor, their parent, reaped them (an exit status, or hung and killed by it), every
    rank's last beat at the detection, the kernel log for the lost pids, and the run folder's metrics
    and checkpoints up to the detection. The job went on, so there is no end state."""
    detected = entry.time - entry.total_s
    exited = {lost.rank: lost.exit_code for lost in entry.lost if lost.exit_code is not None}
    noted = {lost.rank: lost.exit_note for lost in entry.lost if lost.exit_note}
    hung = {lost.rank for lost in entry.lost if lost.exit_code is None}
    host = inert(entry.host) if entry.host else None
    ev = Evidence(state=IN_PROCESS_STATE, reason=inert(entry.trigger), rank_exit_codes=exited,
                  heartbeat_age_s={r: round(max(0.0, detected - t), 3) for r, t in entry.beats.items()},
                  # a hung rank lived without progress until the supervisor killed it: stalled_rank's "stopped"
                  ranks_at_end={r: "gone" if r in exited else "stopped" if r in hung else "running"
                                for r in sorted({*entry.beats, *exited, *hung})},
                  noted_ranks=sorted(noted), error_lines=[inert(f"rank {r}: {note}") for r, note in noted.items()],
                  failing_rank=entry.lost[0].rank if entry.lost else None,
                  failing_node=inert(entry.lost[0].host) if entry.lost and entry.lost[0].host else host,
                  # each replaced rank names its own node; the record keeps no node for the others (the leader's)
                  rank_nodes={**({r: host for r in entry.beats} if host else {}),
                              **{lost.rank: inert(lost.host) for lost in entry.lost if lost.host}})
    ev.silent_ranks = sorted(set(exited) - set(noted)) if noted else []
    ev.signal = _signal_of(next(iter(exited.values()))) if len(exited) == 1 else None
    ev.kernel_log_read, ev.oom_kills = kernel_oom_kills({lost.pid for lost in entry.lost})
    _metrics_evidence(Path(run_dir), ev, until=detected)
    return ev


def _reason_signal(reason: str) -> str | None:
    m = re.search(r"\b(SIG[A-Z]+)\b", reason or "")
    return m.group(1) if m else None
