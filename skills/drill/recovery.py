"""Which recovery path a drill's job took and what each phase cost, read from the run's own records
(issue 27 item 3): an in-process restart from the trainer's RUN/recoveries.jsonl, a requeue from the
scheduler's job times, the checkpoint journal's load entry and the metrics. A phase whose record is
missing or does not add up is reported as unknown, with the record that would have told, never
filled in with a guess."""
from __future__ import annotations

from pydantic import BaseModel, Field

from trainops.run_records import RecoveryPath, read_journal, read_metrics, read_recoveries

REQUEUE_PHASES = ("detect", "cancel", "submit", "queue", "start", "load", "first_step")
"""A requeue: fault -> detected; detected -> the old job's end (scheduler); end -> the requeue asked
(isolation: drain, quarantine); asked -> the new job running (scheduler); running -> checkpoint load
begins (processes, imports, rendezvous); the load (journal); load done -> first step (metrics)."""


class RecoveryMarks(BaseModel):
    """What the drill saw itself, and the scheduler's times of the two jobs, kept in the drill record
    so the phases can be derived again from the run's records."""

    injected_at: float
    detected_at: float
    ended_at: float | None = Field(None, description="the faulty job's end, as the scheduler recorded it")
    requeued_at: float | None = Field(None, description="when the drill asked for the requeue")
    started_at: float | None = Field(None, description="the requeued job's start, as the scheduler recorded it")


class MeasuredRecovery(BaseModel):
    """A recovery path and its phases, each from a named record; None where the record cannot tell."""

    path: RecoveryPath | None = Field(description="None: the records do not say which path recovered the job")
    phases_s: dict[str, float | None] = Field(description="seconds per phase, in order; None: unknown")
    total_s: float | None = Field(description="detection -> the first step after the recovery; None: unknown")
    first_step_at: float | None = None
    resumed_step: int | None = Field(None, description="in-process: the step the run continued from")
    checkpoint: str | None = Field(None, description="in-process: the checkpoint it read; None: a peer's memory")
    admitted_on: dict[int, str] = Field(default_factory=dict, description="in-process: rank -> the node of the "
                                        "spare that took it")
    unknown: list[str] = Field(default_factory=list, description="each phase that cannot be told, and why")
    basis: str = Field(description="the records the figures were read from")


def _span(start: float | None, end: float | None) -> float | None:
    """end - start when both are known and in order; a negative span is a record that does not add up."""
    if start is None or end is None or end < start:
        return None
    return round(end - start, 4)


def in_process_recovery(run_dir: str, since: float) -> MeasuredRecovery | None:
    """The first in-process recovery the trainer recorded after `since`; None when it recorded none
    (a torn or edited line is not a recovery)."""
    entry = next((e for e in read_recoveries(run_dir) if e.time > since and e.path != "requeue"), None)
    if entry is None:
        return None
    phases: dict[str, float | None] = {name: entry.phases_s.get(name)
                                       for name in ("detect", "abort", "admit", "load", "first_step")}
    unknown = [f"{name}: not in {run_dir}/recoveries.jsonl" for name, value in phases.items() if value is None]
    return MeasuredRecovery(path=entry.path, phases_s=phases, total_s=entry.total_s, first_step_at=entry.time,
                            resumed_step=entry.resumed_step, checkpoint=entry.checkpoint, unknown=unknown,
                            admitted_on=entry.admitted_on,
                            basis=f"{run_dir}/recoveries.jsonl (generation {entry.generation}, "
                                  f"{entry.trigger or 'no trigger recorded'}, from {entry.source})")


def requeue_recovery(run_dir: str, marks: RecoveryMarks) -> MeasuredRecovery:
    """The requeue's phases from the scheduler's times of the two jobs, the journal's load entry
    after the requeue and rank 0's first metrics record after that load."""
    since = marks.requeued_at if marks.requeued_at is not None else marks.detected_at
    load = next((e for e in read_journal(run_dir).loads if e.time > since), None)
    load_s = load.load_s if load is not None else None
    load_start = load.time - load_s if load is not None and load_s is not None else None
    after = load.time if load is not None else since
    first = next((m.time for m in read_metrics(run_dir) if m.rank == 0 and m.time > after), None)
    phases = {"detect": _span(marks.injected_at, marks.detected_at),
              "cancel": _span(marks.detected_at, marks.ended_at),
              "submit": _span(marks.ended_at, marks.requeued_at),
              "queue": _span(marks.requeued_at, marks.started_at),
              "start": _span(marks.started_at, load_start),
              "load": round(load_s, 4) if load_s is not None and load_s >= 0 else None,
              "first_step": _span(load.time if load is not None else None, first)}
    why = {"cancel": "the scheduler's end time of the faulty job", "submit": "the scheduler's end time or the "
           "requeue's time", "queue": "the scheduler's start time of the requeued job", "start": "a load entry with "
           f"load_s in {run_dir}/checkpoints.jsonl after the requeue", "load": f"a load entry with load_s in {run_dir}/"
           "checkpoints.jsonl after the requeue", "first_step": f"a load entry in {run_dir}/checkpoints.jsonl and "
           f"rank 0's metrics after it", "detect": "the injection and detection times"}
    unknown = [f"{name}: no {why[name]} (or it does not follow the phase before)"
               for name, value in phases.items() if value is None]
    total = _span(marks.detected_at, first) if load is not None else None
    return MeasuredRecovery(path="requeue", phases_s=phases, total_s=total, first_step_at=first, unknown=unknown,
                            basis=f"the scheduler's job times, {run_dir}/checkpoints.jsonl (load entry), "
                                  f"{run_dir}/metrics.jsonl (rank 0's first step after it)")


def phases_line(measured: MeasuredRecovery) -> str:
    """The path and its phases in one line, unknown phases named as such."""
    parts = ", ".join(f"{name} {value:.2f} s" if value is not None else f"{name} unknown"
                      for name, value in measured.phases_s.items())
    return f"{measured.path or 'unknown path'}: {parts}"
