"""The records a job writes into its run folder, typed, and a tolerant reader for each: metrics,
heartbeats, the checkpoint journal, injected faults, recoveries, worker events, the launch's status
and a drill's record. Where each file lies is `RunFiles` (trainops/run_folder.py); the trainer and
the framework adapters write these files, and tools, skills and benchmarks read them here and
nowhere else.

Every reader is tolerant: a missing file reads as empty, a torn or garbled line (or one that does
not fit its model) is skipped, and none of them raises on what it finds.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from trainops.record_keys import run_key, seal, sealed_with
from trainops.run_folder import RunFiles, complete_lines, read_regular

T = TypeVar("T")
MAX_STEP = 10**12  # bounds a record must keep to be read at all: a step or rank beyond them is poison
MAX_RANK = 1 << 20


def _parsed(lines: list[bytes], parse: Callable[[bytes], T]) -> list[T]:
    """Each line parsed; a blank, torn or garbled line, or one that does not fit the model, is left out."""
    out = []
    for line in lines:
        if line.strip():
            try:
                out.append(parse(line))
            except (ValidationError, ValueError):
                continue
    return out


# --- metrics.jsonl ---------------------------------------------------------------------------

_FINITE_ONLY = ("time", "step_time_s", "tokens_per_s", "flops_per_token", "tflops", "mfu_pct", "peak_mem_gib",
                "data_wait_s", "compute_time_s")


class MetricsRecord(BaseModel):
    """One step of one rank, one line of `metrics.jsonl` (DESIGN.md's metrics record; the same names
    in Prometheus with a `trainops_` prefix). The trainer writes every field; a framework adapter
    writes what the framework's log printed, so all but the step are optional. Extra fields (a
    writer's own) are kept, for lookups by a metric name."""

    model_config = ConfigDict(extra="allow")

    step: int = Field(ge=0, le=MAX_STEP)
    rank: int = Field(0, ge=0, le=MAX_RANK)
    time: float = Field(0.0, description="Unix seconds when the step's record was written.")
    loss: float | None = None
    grad_norm: float | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = Field(None, description="This device's tokens per second.")
    flops_per_token: float | None = None
    tflops: float | None = Field(None, description="Achieved TFLOP/s of this device.")
    mfu_pct: float | None = None
    peak_mem_gib: float | None = None
    data_wait_s: float | None = None
    peak_source: str | None = Field(None, description="Where the MFU's peak came from (vendor table, measured GEMM).")
    mfu_source: str | None = Field(None, description="A framework adapter's: who computed the MFU.")
    param_checksum: float | str | None = Field(None, description="Sum of this rank's parameters: replicas agree.")
    replica_group: str | None = Field(None, description="Ranks with the same group hold the same parameters.")
    compute_time_s: float | None = Field(None, description="The step's compute alone, where a writer times it.")
    host: str | None = Field(None, description="The rank's node, where a writer records it.")

    @model_validator(mode="after")
    def _finite_measurements(self) -> MetricsRecord:
        """A NaN or infinite loss or grad norm is a signal (divergence, a flipped bit) and is kept; a
        non-finite time, throughput or MFU measures nothing, so it reads as not written."""
        for name in _FINITE_ONLY:
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                object.__setattr__(self, name, 0.0 if name == "time" else None)
        return self

    def written(self) -> dict[str, Any]:
        """The fields this line carries (declared or extra) by name, as written: for a lookup by a
        metric name the caller chose. A field the writer left out is absent, not None."""
        return {name: getattr(self, name) for name in self.model_fields_set}


class MetricsRead(NamedTuple):
    """The records one bounded read of `metrics.jsonl` found, the offset to read from next, and what it
    left out ("" when nothing: see run_folder.complete_lines for the caps)."""
    records: list[MetricsRecord]
    offset: int
    cut: str


def metrics_since(run_dir: str | Path, offset: int = 0) -> MetricsRead:
    """The records appended to `metrics.jsonl` after byte `offset` (the newest, within the read caps),
    and the offset to read from next: a watcher reads each line once."""
    read = complete_lines(RunFiles(run_dir).metrics, offset)
    return MetricsRead(_parsed(read.lines, MetricsRecord.model_validate_json), read.offset, read.cut("metrics.jsonl"))


def read_metrics(run_dir: str | Path) -> list[MetricsRecord]:
    """The records of `metrics.jsonl` in the order written (all ranks; a resumed run repeats steps): the
    newest, within the read caps."""
    return metrics_since(run_dir).records


# --- heartbeat/rank{R}.json --------------------------------------------------------------------

class RankExit(BaseModel):
    """How a rank ended, noted by the rank itself on its way out (a killed rank notes nothing)."""

    time: float
    error: str = ""
    stopped_by: str | None = Field(None, description="The signal its launcher or scheduler stopped it with (a "
                                   "teardown, not an error of its own); None: it ended by itself.")
    where: str = Field("", description="What it was doing when stopped: its innermost frames, as it saw them.")


class Heartbeat(BaseModel):
    """A rank's latest sign of life, rewritten whole at every step."""

    step: int = Field(ge=0, le=MAX_STEP)
    time: float = Field(0.0, description="Unix seconds of the beat; 0 when the rank noted its exit before its "
                                         "first beat.")
    pid: int | None = Field(None, description="The rank's process id: a claim of the job's, only ever read.")
    host: str | None = None
    exit: RankExit | None = None


def read_heartbeat(run_dir: str | Path, rank: int) -> Heartbeat | None:
    """Rank `rank`'s heartbeat; None when it has none yet (or it is unreadable)."""
    try:
        return Heartbeat.model_validate_json(read_regular(RunFiles(run_dir).heartbeat(rank)) or b"")
    except ValidationError:
        return None


def read_heartbeats(run_dir: str | Path) -> dict[int, Heartbeat]:
    """rank -> heartbeat, for every rank that has a readable one."""
    beats: dict[int, Heartbeat] = {}
    for path in RunFiles(run_dir).heartbeat_dir.glob("rank*.json"):
        rank = path.stem.removeprefix("rank")
        if rank.isascii() and rank.isdigit() and int(rank) <= MAX_RANK and (beat := read_heartbeat(run_dir, int(rank))):
            beats[int(rank)] = beat
    return dict(sorted(beats.items()))


# --- checkpoints.jsonl ------------------------------------------------------------------------

class SaveEntry(BaseModel):
    """A checkpoint committed (COMMIT.json written, the folder renamed), journalled by rank 0. Its times
    are finite and not negative, or the line is not a save (a job's NaN or -1 would reach R-ESC-4)."""

    model_config = ConfigDict(allow_inf_nan=False)

    event: Literal["save"]
    step: int
    path: str = ""
    time: float = Field(0.0, description="Unix seconds of the commit.")
    write_s: float = Field(0.0, ge=0, description="From the save's start to its commit.")
    stall_s: float = Field(ge=0, description="How long training waited for the save; where a journal does not say, "
                                       "the whole write (a sync save) stalled it.")
    wait_previous_s: float = Field(0.0, ge=0, description="Part of the stall spent waiting for the previous background "
                                                    "write to finish.")
    size_bytes: int = 0
    mode: str | None = None
    world_size: int | None = None
    pruned_steps: list[int] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _sync_stall(cls, data: Any) -> Any:
        if isinstance(data, dict) and "stall_s" not in data:
            return {**data, "stall_s": data.get("write_s", 0.0)}
        return data


class FallbackEntry(BaseModel):
    """A committed checkpoint that failed verification when a run started, so it loaded an older one."""

    event: Literal["fallback"]
    step: int
    path: str = ""
    time: float = 0.0
    reason: str = ""


class LoadEntry(BaseModel):
    """The checkpoint a run started from."""

    event: Literal["load"]
    step: int
    path: str
    time: float = 0.0
    verified: bool = Field(False, description="Checked against its COMMIT.json as it was loaded.")
    load_s: float | None = Field(None, description="Seconds the load took (slowest rank); `time` is its end.")


JournalEntry = Annotated[SaveEntry | FallbackEntry | LoadEntry, Field(discriminator="event")]
_JOURNAL_ENTRY: TypeAdapter[JournalEntry] = TypeAdapter(JournalEntry)


@dataclass(frozen=True)
class CheckpointJournal:
    """`checkpoints.jsonl` by event, each list in the order written."""

    saves: list[SaveEntry]
    fallbacks: list[FallbackEntry]
    loads: list[LoadEntry]


def read_journal(run_dir: str | Path) -> CheckpointJournal:
    """The run's checkpoint journal; an event of a kind not known here is left out."""
    entries = _parsed(complete_lines(RunFiles(run_dir).checkpoint_journal)[0], _JOURNAL_ENTRY.validate_json)
    return CheckpointJournal(saves=[e for e in entries if isinstance(e, SaveEntry)],
                             fallbacks=[e for e in entries if isinstance(e, FallbackEntry)],
                             loads=[e for e in entries if isinstance(e, LoadEntry)])


# --- faults.jsonl -----------------------------------------------------------------------------

class FaultRecord(BaseModel):
    """A fault injected into the run, written the moment before it acts: by the trainer's injector
    (it fires at a step) or by a drill tool at run time (no step). Extra fields are the injection's
    detail (the crash mode, the flipped parameter, the damaged file, the signalled pids)."""

    model_config = ConfigDict(extra="allow")

    kind: str
    time: float = Field(description="Unix seconds of the injection.")
    step: int | None = Field(None, description="The step the trainer's injector fired at; None for a drill tool's.")
    rank: int | None = None
    node: str | None = None


def read_faults(run_dir: str | Path) -> list[FaultRecord]:
    """Every fault recorded in the run, oldest first."""
    return _parsed(complete_lines(RunFiles(run_dir).faults)[0], FaultRecord.model_validate_json)


# --- recoveries.jsonl -------------------------------------------------------------------------

RECOVERY_PHASES = ("detect", "abort", "admit", "load", "first_step")
RecoveryPath = Literal["in-process", "spare-admitted", "requeue"]
"""How a job came back from a lost rank: restarted in its own processes, a warm spare admitted, or requeued."""


class LostRank(BaseModel):
    """A rank an in-process recovery replaced, as the supervisor (its parent process) saw it at detection."""

    rank: int = Field(ge=0)
    pid: int = Field(description="The process the supervisor started for it (a child it reaped).")
    exit_code: int | None = Field(None, description="Its exit status as the supervisor reaped it (negative: "
                                                     "that signal); None when it hung and the supervisor killed it.")
    last_beat: float | None = Field(None, description="Unix seconds of its last heartbeat before the detection.")
    exit_note: str = Field("", description="The error it noted on its way out, if it noted one.")
    host: str = Field("", description="The node it ran on.")


class RecoveryEntry(BaseModel):
    """One recovery of the run, appended by whoever recovered it (the in-process supervisor, or a
    drill that requeued the job) once the first step after it finished: which path it took and what
    each phase cost."""

    time: float = Field(description="Unix seconds when the first step after the recovery finished.")
    path: RecoveryPath
    failed_ranks: list[int] = Field(default_factory=list)
    trigger: str = Field("", description="What was detected, e.g. 'rank 1 exited with code -9'.")
    generation: int = Field(ge=0, description="1 for the job's first in-process restart, 2 for the next, ...")
    resumed_step: int = Field(ge=0, le=MAX_STEP, description="The step the run continued from.")
    source: Literal["storage", "peer"] = Field(description="Checkpoint read from storage, or a replica's memory.")
    checkpoint: str | None = None
    phases_s: dict[str, float] = Field(default_factory=dict, description="Seconds per phase, keys among "
                                       "detect, abort, admit, load, first_step.")
    total_s: float = Field(description="From the fault detected to the first step done after the recovery.")
    lost: list[LostRank] = Field(default_factory=list, description="The replaced ranks at detection: the "
                                 "evidence of the interruption record (tools/reliability/interruptions.py).")
    beats: dict[int, float] = Field(default_factory=dict, description="Every rank's last heartbeat time at "
                                    "detection: which ranks still ran.")
    host: str = Field("", description="The host of the supervisor that led the recovery (the job's first node).")
    lost_nodes: list[str] = Field(default_factory=list, description="Nodes that went silent with the lost ranks.")
    admitted_on: dict[int, str] = Field(default_factory=dict, description="rank -> the node of the spare that "
                                        "took it (a lost node's ranks move onto a spare node).")
    mac: str = Field("", description="The supervisor's seal of every other field under its run's key "
                                     "(trainops/record_keys.py); a line without a valid one is not read.")

    def sealed(self, key: bytes) -> RecoveryEntry:
        return self.model_copy(update={"mac": seal(key, self.model_dump_json(exclude={"mac"}))})

    @model_validator(mode="after")
    def _known_phases(self) -> RecoveryEntry:
        unknown = set(self.phases_s) - set(RECOVERY_PHASES)
        if unknown:
            raise ValueError(f"phases_s: unknown phase(s) {sorted(unknown)}; use {list(RECOVERY_PHASES)}")
        return self


def read_recoveries(run_dir: str | Path) -> list[RecoveryEntry]:
    """Every recovery the supervisor trainops launched for this run sealed, oldest first: a line the
    job (or anything else) wrote without the run's key, a torn or garbled one, is skipped."""
    key = run_key(run_dir)
    return [entry for entry in _parsed(complete_lines(RunFiles(run_dir).recoveries)[0],
                                       RecoveryEntry.model_validate_json)
            if sealed_with(key, entry.model_dump_json(exclude={"mac"}), entry.mac)]


# --- workers.jsonl ----------------------------------------------------------------------------

class WorkerEvent(BaseModel):
    """One line of RUN/workers.jsonl, appended by the in-process supervisor: a worker process started,
    was given a rank (assigned, or admitted as a spare), or was lost. Only a supervised launch writes it."""

    time: float
    worker: int
    pid: int
    host: str = ""
    event: str
    rank: int | None = None


def read_worker_events(run_dir: str | Path) -> list[WorkerEvent]:
    """Every worker event of the run, oldest first (a torn or garbled line is skipped)."""
    return _parsed(complete_lines(RunFiles(run_dir).workers)[0], WorkerEvent.model_validate_json)


def supervised_since(run_dir: str | Path, since: float) -> bool:
    """A launch at or after `since` ran under the in-process supervisor (it started workers then)."""
    return any(e.event == "started" and e.time >= since for e in read_worker_events(run_dir))


# --- status.json ------------------------------------------------------------------------------

class RunResult(BaseModel):
    """How a launch of the run ended: `status.json`, written whole when the launcher's torchrun exits."""

    run_dir: str = Field(description="the run folder")
    status: Literal["ok", "failed"] = Field(description="ok only when every rank exited 0")
    exit_code: int = Field(description="torchrun's exit code (negative: killed by that signal)")
    final_loss: float | None = Field(None, description="rank 0's loss at the last completed step")
    mfu_pct: float | None = Field(None, description="mean MFU over completed steps after the first "
                                  "(step 1 includes warm-up), all ranks")
    steps_completed: int = Field(0, description="last step rank 0 completed")
    peak_source: str | None = Field(None, description="where the MFU's peak came from")
    failure: str | None = Field(None, description="why it failed: the first rank's error line, "
                                "or the exit code's meaning when no rank left one")
    resumed_from: str | None = Field(None, description="the checkpoint this launch continued from, as the "
                                     "trainer logged loading it (None: it started fresh)")


def read_status(run_dir: str | Path) -> RunResult | None:
    """The last launch's outcome; None while the run has not ended (or the file is unreadable)."""
    try:
        return RunResult.model_validate_json(read_regular(RunFiles(run_dir).status) or b"")
    except ValidationError:
        return None


class NodeEvent(BaseModel):
    """One row of a node drill's per-node timeline, seconds after the injection."""

    t_s: float
    node: str
    event: str


class DrillRecord(BaseModel):
    """RUN/drill.json as the drill wrote it: the drill's result (the skills' DrillResult, kept whole as
    extra fields) and, for a node drill, its per-node timeline."""

    model_config = ConfigDict(extra="allow")

    fault: str | None = None
    injected_time: float
    detection_latency_s: float
    recovery_time_s: float
    node_timeline: list[NodeEvent] | None = None


def read_drill_record(run_dir: str | Path) -> DrillRecord | None:
    """The run's drill record; None when the run was not a drill (or the file is unreadable)."""
    try:
        return DrillRecord.model_validate_json(read_regular(RunFiles(run_dir).drill_record) or b"")
    except ValidationError:
        return None
