"""`watch_job`: R-ESC-1..4 evaluated on a running job, poll by poll, until the job ends (with the
scheduler's reason) or a rule fires. Read-only: it reports what fired and the suspect of a
silent data corruption; handing a fired rule to a human and the SDC response are the caller's
(`trainops watch`, skills/sdc.py), each a gated call of its own."""
from __future__ import annotations

import math
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from trainops.run_records import read_faults, read_heartbeat, read_heartbeats
from trainops.tools.base import ToolError, tool
from trainops.tools.governance.escalation import Escalation, EscalationSignals, checkpoint_save_s, escalations_for
from trainops.tools.ids import JobId
from trainops.tools.reliability import ettr, interruptions
from trainops.tools.reliability.divergence import divergence
from trainops.tools.reliability.job_numbers import wall_clock
from trainops.tools.reliability.signals import DetectFaultsInput, FaultWatch
from trainops.tools.schedulers import get_scheduler
from trainops.tools.schedulers.base import SchedulerError, SchedulerKind


class WatchJobInput(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    job_id: JobId = Field(description="The job id a submit returned.")
    scheduler: SchedulerKind = "local"
    poll_interval_s: float = Field(1.0, ge=0.05, le=600, description="Seconds between polls (down to 0.05).")
    timeout_s: float = Field(3600.0, gt=0, le=7 * 86400, description="Stop watching after this long (at most 7 days).")
    ettr_window_s: float = Field(3600.0, ge=ettr.MIN_WINDOW_S, le=30 * 86400,
                                 description="Width of one effective-training-time window for R-ESC-1.")
    mtbf_h: float | None = Field(None, gt=0, le=1e6, description="Declared MTBF (hours), used while the "
                                 "interruption record is too short to measure one; None: the assumed default.")


class SdcSuspect(BaseModel):
    rank: int
    node: str | None
    step: int
    evidence: str


class WatchJobOutput(BaseModel):
    job_id: str
    run_dir: str | None
    ended: bool = Field(description="The job reached a terminal state.")
    state: str
    reason: str = Field("", description="The scheduler's reason for the state.")
    polls: int
    signals: EscalationSignals
    fired: list[Escalation] = Field(default_factory=list, description="Rules that fired, with their actions.")
    cause_distribution: dict[str, int] = Field(default_factory=dict, description="From the interruption record.")
    suspect: SdcSuspect | None = Field(None, description="The rank and node a replica-checksum mismatch, an "
                                       "unexplained NaN loss or a sustained loss/grad-norm divergence names.")
    heartbeat_age_s: float | None = Field(None, description="Age of the stalest rank heartbeat at the last poll.")
    not_taken: list[str] = Field(default_factory=list, description="Figures the job wrote that the rules did not "
                                 "take: out of range for its wall clock (the value seen).")


class _RunReader:
    """The run's metrics, read incrementally (detect_faults's reader), and what they suspect."""
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.watch = FaultWatch(DetectFaultsInput(run=str(run_dir)), run_dir)

    def sdc(self) -> SdcSuspect | None:
        """A replica-checksum mismatch, a NaN/inf loss no injected NaN explains (no code change), or a
        loss or grad norm that diverged without NaN and stayed diverged (tools/reliability/divergence.py):
        each names a suspect for the same response."""
        records = self.watch.ingest()
        if (odd := self.watch.checksum_mismatch()) is not None:
            rec, why = odd
            return SdcSuspect(rank=rec.rank, node=rec.host or self.host_of(rec.rank), step=rec.step,
                              evidence=f"checksum_mismatch: {why}")
        injected_nan = any(f.kind == "nan" for f in read_faults(self.run_dir))
        for rec in records:
            if rec.loss is not None and not math.isfinite(rec.loss) and not injected_nan:
                return SdcSuspect(rank=rec.rank, node=rec.host or self.host_of(rec.rank), step=rec.step,
                                  evidence=f"loss={rec.loss} at step {rec.step} on rank {rec.rank}, no NaN injected")
        if (found := divergence(self.watch.by_rank, records, self.watch.inp)) is not None:
            rec, why = found
            return SdcSuspect(rank=rec.rank, node=rec.host or self.host_of(rec.rank), step=rec.step,
                              evidence=f"divergence: {why}")
        return None

    def host_of(self, rank: int) -> str | None:
        """The rank's host from its heartbeat (metrics lines do not carry one)."""
        beat = read_heartbeat(self.run_dir, rank)
        return beat.host if beat else None

    def heartbeat_age_s(self) -> float | None:
        beats = read_heartbeats(self.run_dir)
        return max(time.time() - b.time for b in beats.values()) if beats else None


class RecordView(BaseModel):
    """What the interruption record says for R-ESC-1 and R-ESC-4: the same view for the SOP, the
    pack and the watch."""
    ettr_pct: list[float] = Field(description="ETTR per closed window, oldest first.")
    window_s: float
    cause_distribution: dict[str, int]
    stats: ettr.ReliabilityStats = Field(description="Rate, MTBF (with its source) and recovery time.")

    @property
    def mtbf_s(self) -> float:
        return self.stats.mtbf_h * 3600


def record_view(window_s: float, declared_mtbf_h: float | None, until: float | None = None) -> RecordView:
    """From the workspace's whole interruption record (every job of the footprint, up to `until`):
    ETTR per window, the cause split and the MTBF with its source. Only closed windows are
    readings: the window still open holds a fraction of its time and would read as noise."""
    every = interruptions.read_interruptions()  # read once: the windows and the MTBF see the whole record
    windows = ettr.ettr_series(window_s, now=until or time.time(), records=every)
    stats = ettr.reliability(declared_mtbf_h, records=every)
    records = [r for r in every if until is None or r.time <= until]
    return RecordView(ettr_pct=[w.ettr_pct for w in windows if w.wall_s >= window_s - 1e-3], window_s=window_s,
                      cause_distribution=interruptions.cause_distribution(records), stats=stats)


def evaluate(inp: WatchJobInput, run_dir: Path | None, reader: _RunReader | None, started_at: float | None):
    """One poll's signals and fired escalations, and the job's figures not taken (a checkpoint stall
    longer than the job has run)."""
    suspect = reader.sdc() if reader else None
    view = record_view(inp.ettr_window_s, inp.mtbf_h)
    save_s, not_taken = checkpoint_save_s([str(run_dir)]) if run_dir else None, []
    start, now = wall_clock(started_at, time.time())
    if save_s is not None and save_s > now - start:
        not_taken.append(f"checkpoint_save_s={save_s:g} (checkpoints.jsonl's median stall) is longer than the job "
                         f"has run ({now - start:.3f} s): not used for R-ESC-4")
        save_s = None
    signals = EscalationSignals(ettr_history_pct=view.ettr_pct, sdc_suspected=suspect is not None,
                                sdc_evidence=_suspect_line(suspect), checkpoint_save_s=save_s,
                                mtbf_s=view.mtbf_s, mtbf_source=view.stats.mtbf_source)
    return signals, escalations_for(signals, view.cause_distribution), view.cause_distribution, suspect, not_taken


def _suspect_line(suspect: SdcSuspect | None) -> str:
    if suspect is None:
        return ""
    return f"rank {suspect.rank} on node {suspect.node or 'unknown'} at step {suspect.step} ({suspect.evidence})"


@tool("watch_job", risk="read", tags=("jobs", "escalation"))
def watch_job(inp: WatchJobInput) -> WatchJobOutput:
    """Watch a running job: each poll reads its state, metrics, heartbeats, checkpoint journal and
    the workspace's interruption record (every job's, as the SOP and the pack read it) and
    evaluates R-ESC-1..4 (falling effective training time, a gain vanished at scale, suspected
    silent data corruption, checkpoint save too slow for the MTBF).
    Returns when the job ends (with its reason) or a rule fires; hand fired rules to a human."""
    try:
        scheduler = get_scheduler(inp.scheduler)
    except SchedulerError as exc:
        raise ToolError("watch_job", str(exc)) from None
    deadline, polls = time.time() + inp.timeout_s, 0
    reader: _RunReader | None = None
    while True:
        polls += 1
        try:
            status = scheduler.status(inp.job_id)
        except SchedulerError as exc:
            raise ToolError("watch_job", str(exc)) from None
        if status.state == "unknown":
            raise ToolError("watch_job", f"job_id: the {inp.scheduler} scheduler knows no job {inp.job_id!r}; pass "
                                         "the id submit_job returned (trainops jobs lists them)")
        run_dir = Path(status.run_dir) if status.run_dir else None
        if reader is None and run_dir is not None and run_dir.is_dir():
            reader = _RunReader(run_dir)
        signals, fired, causes, suspect, not_taken = evaluate(inp, run_dir, reader, status.started_at)
        if fired or status.finished or time.time() >= deadline:
            return WatchJobOutput(job_id=inp.job_id, run_dir=str(run_dir) if run_dir else None,
                                  ended=status.finished, state=status.state, reason=status.reason, polls=polls,
                                  signals=signals, fired=fired, cause_distribution=causes, suspect=suspect,
                                  heartbeat_age_s=reader.heartbeat_age_s() if reader else None, not_taken=not_taken)
        time.sleep(inp.poll_interval_s)
