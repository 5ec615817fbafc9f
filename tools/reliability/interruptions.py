"""The interruption record: every job end that is not a clean finish, recorded once with its
evidence, its cause (tools/reliability/causes.py, from the evidence alone) and what it cost.
It lives in the workspace as `interruptions.jsonl`; every observation of a job end (job_status,
wait_job, the launch-and-follow path) passes `observe`, so a job is recorded however it is seen.
A drill marks its own job (`witness`, just before it ends the job), so its record carries the ranks'
processes as they were, and completes the record with the restart it measured (`complete_recovery`).
Effective training time (ETTR) per window is measured from it in tools/reliability/ettr.py."""
from __future__ import annotations

import fcntl
import logging
import math
import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field

from trainops.run_folder import RunFiles, read_regular, read_tail
from trainops.run_records import Heartbeat, read_heartbeats, read_recoveries, read_status
from trainops.tools.base import tool
from trainops.tools.ids import JobId
from trainops.tools.reliability.causes import CAUSES, Cause, Confidence, Diagnosis, diagnose, scheduler_ended
from trainops.tools.reliability.evidence import (
    NODE_DOWN,
    TRUST_SPECIFICITY,
    Evidence,
    gather,
    gather_in_process,
    inert,
    replay_evidence,
    witness_ranks,
)
from trainops.tools.reliability.job_numbers import bound_evidence, bound_redo, wall_clock
from trainops.workspace import home

log = logging.getLogger(__name__)
RECORD_NAME = "interruptions.jsonl"
MAX_RECORD_FILE = 64 << 20
MAX_REASON_CHARS = 700
_PLANNED_STATES = {"cancelled"}
IN_PROCESS_MARK = "#gen"
"""An in-process recovery's record id: the job's launch id, then this and the recovery's generation."""
STALE_MIN_S, STALE_STEPS = 5.0, 5  # a rank silent longer than this (and 5 steps) at the end had stalled
WITNESS_GRACE_S = 1.0
"""A step may still finish between the witness and the kill; a restart's first step cannot come this soon."""


class Witnessed(BaseModel):
    """A job as trainops saw it just before ending it itself: its record may be written only after a
    restart of the same run rewrote the heartbeats (Slurm holds a job with a lost node COMPLETING), so
    the run folder as it was then is kept, not read again."""
    ranks: dict[int, str]
    beats: dict[int, Heartbeat]
    at: float
    drill: bool


_WITNESSED: dict[tuple[str, str], Witnessed] = {}
"""(scheduler, job) -> what trainops saw just before it ended the job."""


class LostTime(BaseModel):
    """time lost = detection + isolation + restart + steps redone (seconds)."""
    detection_s: float = 0.0
    isolation_s: float = 0.0
    restart_s: float = 0.0
    redo_s: float = 0.0


class Interruption(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    id: str = Field(description="scheduler:job_id@start (a requeue keeps the job id): one record per job end; "
                                "an in-process recovery's is that and #gen<its generation>.")
    job_id: str
    run_dir: str | None = None
    scheduler: str
    name: str = ""
    submitted_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    detected_at: float
    planned: bool = False
    drill: bool = Field(False, description="Ended by a fault drill (the drill marks its own job; a file the job "
                                           "could write does not).")
    cause: Cause
    cause_reason: str = Field(description="The evidence the classifier used.")
    sub_cause: str = Field("", description="The finer cause (ecc, oom, preemption, collective-timeout, ...).")
    confidence: Confidence = Field("low", description="high: a specific signature or trainops' own witnessed "
                                                      "evidence, nothing against it; medium; low.")
    quote: str = Field("", description="The line that names the problem, as logged.")
    next_step: str = Field("", description="What fits the cause (tools/reliability/signatures.py).")
    requeue_helps: bool | None = Field(None, description="Whether a plain requeue can help; None: not known.")
    alternatives: list[str] = Field(default_factory=list, description="Causes other specific lines point to.")
    evidence: Evidence
    lost: LostTime = Field(default_factory=LostTime)
    time_lost_s: float = 0.0
    steps_lost: int = 0

    @property
    def time(self) -> float:
        """When the interruption happened (its end, else its detection)."""
        return self.ended_at or self.detected_at

    @computed_field(description="What kind of fault the evidence shows, in the words a final answer uses (bitflip, "
                                "checkpoint-corruption, nan, partition, node-crash, hang, crash); None: it does not "
                                "say. Named here so every reader, a model included, reads it, not re-derives it.")
    @property
    def fault_kind(self) -> str | None:
        ev = self.evidence
        if ev.checksum_verdict == "disagree":
            return "bitflip"
        if ev.corrupt_checkpoints:
            return "checkpoint-corruption"
        if ev.nonfinite_loss_step is not None:
            return "nan"
        down = any(NODE_DOWN.search(str(state)) for state in ev.node_states.values())
        if down and self.cause in ("network", "hardware"):
            return "partition" if self.cause == "network" else "node-crash"
        # the cause, or a rank trainops itself saw stopped, alive: never words in the reason, which quotes the job
        if self.cause == "hung-peer" or "stopped" in ev.ranks_at_end.values():
            return "hang"
        if ev.silent_ranks or ev.signal == "SIGKILL" or "gone" in ev.ranks_at_end.values():
            return "crash"
        return None


def record_path() -> Path:
    return home() / RECORD_NAME


def read_interruptions(job: str | None = None) -> list[Interruption]:
    """Every record (of one job) in the newest MAX_RECORD_FILE bytes, oldest first; a corrupt line is skipped."""
    data, _ = read_tail(record_path(), MAX_RECORD_FILE) or (b"", 0)
    out = []
    for n, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = Interruption.model_validate_json(line)
        except (ValidationError, ValueError):
            log.warning("%s line %d is not an interruption record; skipped", RECORD_NAME, n)
            continue
        if job is None or rec.job_id == job:
            out.append(rec)
    return out


def cause_distribution(records: list[Interruption], drills_as_injected: bool = False) -> dict[str, int]:
    """Interruptions per cause, every cause named (0 where none). With `drills_as_injected`, a drill's
    job end counts as injected, from trainops' own mark of the drill (`witness`), whatever its evidence
    reads; without, each counts as its evidence reads (how a drill checks the detectors)."""
    counts = dict.fromkeys(CAUSES, 0)
    for rec in records:
        counts["injected" if drills_as_injected and rec.drill else rec.cause] += 1
    return counts


def _lost(ev: Evidence, detected_at: float, wall_s: float) -> tuple[LostTime, int]:
    """What the end cost: detection (last progress -> detected) and the steps since the last commit
    redone at the median step time, within the wall clock; a drill adds isolation and restart."""
    lost = LostTime()
    if ev.last_progress_time:
        lost.detection_s = max(0.0, detected_at - ev.last_progress_time)
    steps = max(0, (ev.last_step or 0) - (ev.committed_step or 0)) if ev.last_step is not None else 0
    lost.redo_s = bound_redo(ev, steps, ev.step_time_s, wall_s)
    return lost, steps


def _stale_s(ev: Evidence) -> float:
    return max(STALE_MIN_S, STALE_STEPS * (ev.step_time_s or 0.0))


def healthy(ev: Evidence) -> bool:
    """Nothing went wrong before the end: no error line, no line a failure signature names, no NaN/inf,
    replicas agree, every rank still beating (a cancel of a run in this state is an operator's planned stop)."""
    return (all(st == "running" for st in ev.ranks_at_end.values()) and not ev.error_lines
            and not any(h.specificity >= TRUST_SPECIFICITY for h in ev.signatures)
            and ev.nonfinite_loss_step is None and ev.checksum_verdict != "disagree"
            and ev.exit_code in (None, 0, -15, 143) and max(ev.heartbeat_age_s.values(), default=0.0) <= _stale_s(ev))


def is_clean(status) -> bool:
    """A finish that lost no training: the scheduler says completed and the run did not fail. A
    completed job whose step the scheduler still marks with a signal (Slurm: a teardown that timed out
    after every rank was done) is clean only when the run itself wrote an ok status during this launch."""
    if status.state != "completed":
        return False
    if status.exit_code in (0, None):
        return not _run_failed(status.run_dir)
    return _run_finished_ok_since(status.run_dir, status.started_at)


def _run_status(run_dir: str | None):
    return read_status(run_dir) if run_dir and Path(run_dir).is_dir() else None


def _run_failed(run_dir: str | None) -> bool:
    result = _run_status(run_dir)
    return result is not None and result.status == "failed"


def _run_finished_ok_since(run_dir: str | None, started_at: float | None) -> bool:
    result = _run_status(run_dir)
    if result is None or result.status != "ok" or result.exit_code != 0:
        return False
    written = RunFiles(run_dir).status.stat().st_mtime
    return started_at is None or written >= started_at


def record_id(scheduler: str, status) -> str:
    """One id per job end: a requeued job keeps its id, so its start time tells its launches apart."""
    return f"{scheduler}:{status.job_id}" + (f"@{status.started_at:.3f}" if status.started_at else "")


def witness(job_id: str, scheduler: str, run_dir: str, drill: bool = False) -> dict[int, str]:
    """Just before trainops ends a job itself: each rank's process as it is now, kept for the record
    of this job's end (with `drill`, the record is marked a drill's)."""
    seen = witness_ranks(run_dir, job_id, scheduler)
    _WITNESSED[(scheduler, job_id)] = Witnessed(ranks=seen, beats=read_heartbeats(run_dir), at=time.time(),
                                                drill=drill)
    return seen


def build(status, scheduler: str, node_states: dict[str, str] | None = None,
          detected_at: float | None = None, job_log: str = "") -> Interruption:
    """The record of one job end from what it showed."""
    detected_at = detected_at or time.time()
    seen = _WITNESSED.pop((scheduler, status.job_id), None)
    drill = seen is not None and seen.drill
    ev = (gather(status, node_states, job_log, ranks_at_end=seen.ranks, beats=seen.beats,
                 until=seen.at + WITNESS_GRACE_S) if seen else gather(status, node_states, job_log))
    wall_s = bound_evidence(ev, status.started_at or status.submitted_at, status.ended_at or detected_at)
    cancelled = status.state in _PLANNED_STATES and healthy(ev)
    found = diagnose(ev, planned=cancelled, stale_s=_stale_s(ev))
    planned = cancelled and scheduler_ended(ev) is None  # an operator's stop; Slurm calls a preemption cancelled too
    lost, steps = _lost(ev, detected_at, wall_s)
    return Interruption(id=record_id(scheduler, status), job_id=status.job_id, run_dir=status.run_dir,
                        scheduler=scheduler, name=inert(status.name), submitted_at=status.submitted_at,
                        started_at=status.started_at, ended_at=status.ended_at, detected_at=detected_at,
                        planned=planned, drill=drill, evidence=ev, lost=lost, time_lost_s=_total(lost),
                        steps_lost=steps, **_verdict(found))


def _reason(text: str) -> str:
    return inert(text, MAX_REASON_CHARS)


def _verdict(found: Diagnosis) -> dict:
    """The record's cause fields from a diagnosis."""
    return {"cause": found.cause, "cause_reason": _reason(found.reason), "sub_cause": found.sub_cause,
            "confidence": found.confidence, "quote": found.quote, "next_step": found.next_step,
            "requeue_helps": found.requeue_helps, "alternatives": found.alternatives}


def _total(lost: LostTime) -> float:
    return round(lost.detection_s + lost.isolation_s + lost.restart_s + lost.redo_s, 3)


def _bare_record(status, scheduler: str, exc: Exception) -> Interruption:
    """The record of a job end from the scheduler's status alone, when what the run folder held could
    not make one: marked so, and still counted by the restart budget and the MTBF."""
    ev = Evidence(state=status.state, reason=inert(status.reason), exit_code=status.exit_code,
                  not_taken=[_reason(f"the run folder's evidence was left out, it did not make a valid record: {exc}")])
    times = {k: t if t is not None and math.isfinite(t) else None
             for k, t in (("submitted_at", status.submitted_at), ("started_at", status.started_at),
                          ("ended_at", status.ended_at))}
    return Interruption(id=record_id(scheduler, status), job_id=status.job_id, run_dir=status.run_dir,
                        scheduler=scheduler, name=inert(status.name), detected_at=time.time(), evidence=ev, **times,
                        **_verdict(diagnose(ev)))


def _open_record():
    fd = os.open(record_path(), os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    return os.fdopen(fd, "a+")


def record_job_end(status, scheduler: str, node_states: dict[str, str] | None = None,
                   job_log: str = "") -> Interruption | None:
    """Record a terminal, not-clean job end once (by job end): the stored record when it already
    exists, None for a clean finish or a job still running."""
    if not status.finished or is_clean(status):
        return None
    key = record_id(scheduler, status)
    with _open_record() as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        known = next((r for r in read_interruptions(status.job_id) if r.id == key), None)
        if known is not None:
            _WITNESSED.pop((scheduler, status.job_id), None)
            return known
        try:
            rec = build(status, scheduler, node_states, job_log=job_log)
        except (ValidationError, ValueError, ArithmeticError) as exc:  # the end is recorded all the same
            rec = _bare_record(status, scheduler, exc)
        fh.write(rec.model_dump_json() + "\n")
        fh.flush()
    return rec


def record_in_process_recoveries(status, scheduler: str) -> list[Interruption]:
    """Record each in-process recovery of the job's run (RUN/recoveries.jsonl) once: the job did not
    end, but a rank was lost and the time to the first step after it was not training. Its evidence is
    the supervisor's (gather_in_process); returns the records made now."""
    entries = [e for e in read_recoveries(status.run_dir) if e.path != "requeue"] if status.run_dir else []
    if not entries:
        return []
    made = []
    with _open_record() as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        known = {r.id for r in read_interruptions(status.job_id)}
        for entry in entries:
            key = f"{record_id(scheduler, status)}{IN_PROCESS_MARK}{entry.generation}"
            if key in known:
                continue
            rec = _in_process_record(key, status, scheduler, entry)
            fh.write(rec.model_dump_json() + "\n")
            made.append(rec)
        fh.flush()
    return made


def in_process_record(job_id: str, since: float) -> Interruption | None:
    """The record of the job's first in-process recovery detected after `since` (a drill's own)."""
    return next((r for r in read_interruptions(job_id) if IN_PROCESS_MARK in r.id and r.detected_at >= since), None)


def _in_process_record(key: str, status, scheduler: str, entry) -> Interruption:
    ev = gather_in_process(entry, status.run_dir)
    start, now = wall_clock(status.started_at or status.submitted_at, time.time())
    detected_at = min(max(entry.time - entry.total_s, start), now)  # the job goes on: its wall clock ends now
    wall_s = bound_evidence(ev, start, detected_at)
    found = diagnose(ev, stale_s=_stale_s(ev))
    lost, _ = _lost(ev, detected_at, wall_s)
    steps = max(0, ev.last_step - entry.resumed_step) if ev.last_step is not None else 0  # redone from the resume
    lost.redo_s = bound_redo(ev, steps, ev.step_time_s, wall_s)
    lost.restart_s = min(max(0.0, entry.total_s), now - detected_at)
    return Interruption(id=key, job_id=status.job_id, run_dir=status.run_dir, scheduler=scheduler,
                        name=inert(status.name), submitted_at=status.submitted_at, started_at=status.started_at,
                        detected_at=detected_at, evidence=ev, lost=lost, time_lost_s=_total(lost), steps_lost=steps,
                        **_verdict(found))


def complete_recovery(rec_id: str, detection_s: float, isolation_s: float, restart_s: float,
                      node_states: dict[str, str] | None = None) -> Interruption:
    """A drill's measured recovery completes its record once the restart ran: detection, isolation and
    restart (the record was written at the end, before the restart existed), the replay's evidence
    (the NaN step replayed, checkpoints that failed verification on load, nodes the scheduler flagged
    since) and the cause that evidence then supports. The one record is rewritten in place, under the
    record's lock."""
    with _open_record() as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        lines = (read_regular(record_path(), MAX_RECORD_FILE) or b"").decode(errors="replace").splitlines()
        ids = [_line_id(ln) for ln in lines]
        rec = next((Interruption.model_validate_json(ln) for ln, i in zip(lines, ids, strict=True) if i == rec_id),
                   None)
        if rec is None:
            raise ValueError(f"interruption {rec_id!r} is not in the record; record the job end first")
        ev = rec.evidence.model_copy(deep=True)
        ev.node_states.update({inert(k): inert(v) for k, v in (node_states or {}).items()})
        if rec.run_dir and Path(rec.run_dir).is_dir():
            replay_evidence(ev, rec.run_dir, rec.ended_at or rec.detected_at)
        found = diagnose(ev, planned=rec.planned, stale_s=_stale_s(ev))
        lost = rec.lost.model_copy(update={"detection_s": max(0.0, detection_s), "isolation_s": max(0.0, isolation_s),
                                           "restart_s": max(0.0, restart_s)})
        done = rec.model_copy(update={"evidence": ev, **_verdict(found), "lost": lost, "time_lost_s": _total(lost),
                                      "drill": True})
        fh.seek(0)
        fh.truncate()  # every other line as it was, even one that does not parse
        kept = (done.model_dump_json() if i == rec_id else ln for ln, i in zip(lines, ids, strict=True))
        fh.write("".join(line + "\n" for line in kept))
        fh.flush()
    return done


def _line_id(line: str) -> str | None:
    try:
        return Interruption.model_validate_json(line).id
    except (ValidationError, ValueError):
        return None


def observe(status, scheduler) -> None:
    """Every job observation passes here: its in-process recoveries, and its end when that is not a
    clean finish, are recorded; a failure to record never fails the caller."""
    kind = getattr(scheduler, "kind", str(scheduler))
    try:
        record_in_process_recoveries(status, kind)
    except (OSError, ValueError, ValidationError) as exc:
        log.warning("interruption record: in-process recoveries of job %s not recorded: %s", status.job_id, exc)
    if status.finished:
        _record_earlier_launches(status, scheduler, kind)
    if not status.finished or is_clean(status):
        return
    try:
        if any(r.id == record_id(kind, status) for r in read_interruptions(status.job_id)):
            _WITNESSED.pop((kind, status.job_id), None)
            return  # recorded already: every later poll of the job does not ask the scheduler again
        nodes = _quietly(lambda: {n.name: n.state for n in scheduler.list_nodes() if n.name in status.nodes}, {})
        job_log = _quietly(lambda: scheduler.logs(status.job_id, 200), "")
        record_job_end(status, kind, nodes if status.nodes else {}, job_log)
    except (OSError, ValueError, ValidationError) as exc:
        log.warning("interruption record: job %s not recorded: %s", status.job_id, exc)


def _record_earlier_launches(status, scheduler, kind: str) -> None:
    """A job the scheduler requeued itself (a node failure, a preemption) ended one launch unseen and
    may since have finished clean: each earlier launch the scheduler's accounting keeps is recorded as
    its own end, with its own nodes' states and its part of the job log."""
    earlier = getattr(scheduler, "earlier_launches", None)
    launches = _quietly(lambda: earlier(status.job_id, status), []) if earlier else []
    known = {r.id for r in read_interruptions(status.job_id)} if launches else set()
    launches = [past for past in launches if record_id(kind, past) not in known]
    if not launches:
        return
    states = _quietly(lambda: {n.name: n.state for n in scheduler.list_nodes()}, {})
    job_log = _quietly(lambda: scheduler.logs(status.job_id, 400), "")
    for launch in launches:
        try:
            record_job_end(launch, kind, {n: s for n, s in states.items() if n in launch.nodes}, job_log)
        except (OSError, ValueError, ValidationError) as exc:
            log.warning("interruption record: an earlier launch of job %s not recorded: %s", status.job_id, exc)


def _quietly(read, default):
    """Node states and the job log are evidence when readable, never a precondition."""
    try:
        return read()
    except Exception:  # noqa: BLE001 - any backend failure leaves that evidence out
        return default


# --- tools ----------------------------------------------------------------------------------

class InterruptionsInput(BaseModel):
    job_id: JobId | None = Field(None, max_length=200, description="Only this job's records; None: all.")


class InterruptionsOutput(BaseModel):
    interruptions: list[Interruption]
    cause_distribution: dict[str, int]


@tool("list_interruptions", risk="read", tags=("jobs", "reliability"))
def list_interruptions(inp: InterruptionsInput) -> InterruptionsOutput:
    """The interruption record: every job end that was not a clean finish, with its evidence (exit
    code or signal, failing rank and node, last error lines, heartbeat ages, node states, checksum
    verdict, data position), its cause with the reason, planned/drill flags, time and steps lost."""
    records = read_interruptions(inp.job_id)
    return InterruptionsOutput(interruptions=records, cause_distribution=cause_distribution(records))
