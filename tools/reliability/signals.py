"""The signals fault detection reads and how a finding is judged: the mechanisms and which
injected fault produces which (SIGNALS), the detector's thresholds (DetectFaultsInput), and
`FaultWatch`, what one watch has read of a run so far with the checks that read it.

Mechanisms: process exit (job state or a rank's pid), heartbeat staleness (hang), loss /
grad-norm anomaly (NaN/inf, or a jump far above the median of a longer window past the
early-training swings: a robust z-score on the median absolute deviation and a minimum relative
jump), cross-replica parameter checksum mismatch
(silent data corruption; needs a `param_checksum` field in the metrics records, compared
among ranks of the same `replica_group` field when present), per-rank step-time outlier
(straggler; `compute_time_s` when the trainer writes it, else the `step_time_s` spread). On a
multi-node job, network probes of the ranks' nodes (tools/reliability/reachability.py) name the node a stall
waits on: one that does not answer (a partition, with the stale heartbeat) or one that answers far
later than the others (a slow link, once the job's steps run late).

Each injected fault kind produces its own signal (SIGNALS): a lost node the silent remote rank or the
job's state, a hang a stale heartbeat, a bit flip the replica checksums. Given the injection, a
finding by another mechanism first is a false positive (`FaultWatch.counts`): kept with its time.
The polling loop that asks these checks is the `detect_faults` tool (tools/reliability/detection.py); `watch_job`
reads a run through the same `FaultWatch`."""
from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainops.run_folder import MAX_KEPT_LINES
from trainops.run_records import Heartbeat, MetricsRecord, metrics_since, read_heartbeats
from trainops.tools.ids import JobId, RunRef
from trainops.tools.reliability.reachability import probe_nodes, slow_outlier
from trainops.tools.schedulers.base import SchedulerKind

Mechanism = Literal["process_exit", "heartbeat_stale", "loss_anomaly", "checksum_mismatch", "step_time_outlier",
                    "slow_link"]
PROBE_EVERY_S = 0.25
Isolation = Literal["rank", "node", "replica_group", "job"]
ANOMALY_MIN_HISTORY = 8  # steps of grad-norm history before a jump is judged at all
MIN_HISTORY, MAX_CHECKSUM_STEPS = 64, 1000
"""A watch keeps each rank's newest records (MAX_KEPT_LINES across ranks, at least MIN_HISTORY a rank) and the
newest checksum steps: a long watch, or a job writing records for a million ranks, holds a bounded history."""
SIGNALS: dict[str, tuple[Mechanism, ...]] = {
    # a drill tool's kind (tools/reliability/faults.py) or the trainer's own faults.jsonl kind -> its signals
    "kill_rank": ("process_exit",), "crash": ("process_exit",), "kill_node": ("process_exit",),
    "corrupt_checkpoint": ("process_exit",),  # the drill kills a rank after it, so the restart reads the damage
    "hang": ("heartbeat_stale",),
    "nan": ("loss_anomaly",),
    "bitflip": ("checksum_mismatch",),
    "straggler": ("step_time_outlier", "slow_link"), "slow": ("step_time_outlier", "slow_link"),
    "node_crash": ("process_exit", "heartbeat_stale"), "power_loss": ("process_exit", "heartbeat_stale"),
    "partition": ("heartbeat_stale", "process_exit"),
    "slow_network": ("slow_link", "step_time_outlier"),
}


class DetectFaultsInput(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    run: RunRef = Field(description="Run id or run folder (inside the workspace) to watch.")
    job_id: JobId | None = Field(None, description="The run's job, to watch its state too.")
    scheduler: SchedulerKind = "local"
    poll_interval_s: float = Field(0.1, ge=0.05, le=60, description="Seconds between polls (down to 0.05).")
    timeout_s: float = Field(60.0, gt=0, le=86400,
                             description="Stop watching after this many seconds with nothing found (at most a day).")
    heartbeat_stale_s: float = Field(5.0, gt=0, le=86400,
                                     description="A heartbeat older than this (while others are fresher) is a hang.")
    zscore_threshold: float = Field(6.0, gt=0, le=1e6,
                                    description="A grad norm this many robust deviations (1.4826 x the median absolute "
                                                "deviation) above the median of its window may be an anomaly.")
    anomaly_min_ratio: float = Field(3.0, gt=1, le=1e6,
                                     description="...and only when it is also this many times the window's median (an "
                                                 "early-training swing doubles it).")
    anomaly_window_steps: int = Field(16, ge=ANOMALY_MIN_HISTORY, le=100_000,
                                      description="Steps of grad-norm history the jump is judged against.")
    anomaly_skip_steps: int = Field(10, ge=0, le=1_000_000,
                                    description="Leading steps whose grad-norm jumps are not judged (warm-up "
                                                "swings); a NaN or inf is an anomaly at any step.")
    straggler_ratio: float = Field(1.5, gt=1, le=1e6,
                                   description="Straggler threshold: the ratio between the slow rank's and its peers' "
                                               "median step (or compute) time.")
    window_steps: int = Field(8, ge=3, le=100_000, description="Steps of history for the straggler checks.")
    injected_at: float | None = Field(None,
                                      description="Injection wall time; None reads the newest entry of "
                                                  "RUN/faults.jsonl.")
    fault_kind: str | None = Field(None, max_length=64,
                                   description="The injected fault's kind (inject_fault's, or the trainer's "
                                               "faults.jsonl kind); only its own signals (SIGNALS) count as its "
                                               "detection. None reads the newest entry of RUN/faults.jsonl; with no "
                                               "injection any finding counts.")


class FalsePositive(BaseModel):
    """A finding by another signal than the injected fault's, before the fault's own."""
    mechanism: Mechanism
    rank: int | None = None
    step: int | None = None
    detected_at: float
    after_injection_s: float | None = Field(None, description="detected_at - injected_at (negative: before it).")
    evidence: str = ""


class Detection(BaseModel):
    detected: bool
    mechanism: Mechanism | None = None
    rank: int | None = None
    node: str | None = None
    step: int | None = None
    detected_at: float | None = Field(None, description="Wall time the fault was seen (Unix seconds).")
    injected_at: float | None = None
    detection_latency_s: float | None = Field(None, description="detected_at - injected_at.")
    isolation: Isolation | None = Field(None, description="The smallest unit to take out of service.")
    recommendation: str = ""
    evidence: str = ""
    polls: int = 0
    expected: list[Mechanism] = Field(default_factory=list,
                                      description="The signals the injected fault produces; empty: any finding counts.")
    false_positives: list[FalsePositive] = Field(default_factory=list)


ISOLATION: dict[str, tuple[Isolation, str]] = {
    "process_exit": ("node", "exclude the rank's node (drain it) and requeue the job from its newest checkpoint"),
    "heartbeat_stale": ("node", "cancel the job, drain the hung rank's node, requeue from the newest checkpoint"),
    "loss_anomaly": ("job", "roll the whole job back to the last checkpoint before the anomaly and skip or re-check "
                            "the batch"),
    "checksum_mismatch": ("replica_group",
                          "stop the job, take the diverging replica group's nodes out for a hardware check, restart "
                          "from a verified checkpoint"),
    "step_time_outlier": ("node", "drain the straggler's node and requeue on a hot spare"),
    "slow_link": ("node", "drain the node behind the slow link and requeue on a hot spare; check its NIC, cable and "
                          "switch port before it returns"),
}


def grad_norm_jump(rec: MetricsRecord, history: list[float], inp: DetectFaultsInput) -> str | None:
    """Why `rec`'s grad norm is an anomaly against `history` (the rank's earlier steps, oldest first),
    or None; the first `anomaly_skip_steps` steps are warm-up and not judged."""
    g = rec.grad_norm
    if g is None or rec.step <= inp.anomaly_skip_steps:
        return None
    why = jump(g, history, inp)
    return f"grad_norm {why}" if why else None


def jump(value: float, history: list[float], inp: DetectFaultsInput) -> str | None:
    """Why `value` is far above `history` (finite earlier values, oldest first), or None. Median and
    MAD, not mean and sd: one early swing in a short window made a normal step look 23 sd high
    (issue 24); the jump must also be a multiple of the median. A job writes these numbers: a window
    whose median is not a positive finite number has no scale, and nothing is judged against it."""
    hist = history[-inp.anomaly_window_steps:]
    if len(hist) < ANOMALY_MIN_HISTORY:
        return None
    median = statistics.median(hist)
    if not (math.isfinite(median) and median > 0):
        return None
    spread = 1.4826 * statistics.median(abs(h - median) for h in hist) or 1e-12
    z = (value - median) / spread
    if z > inp.zscore_threshold and value > inp.anomaly_min_ratio * median:
        return (f"{value:.4g} is {value / median:.3g}x the median {median:.4g} of the last {len(hist)} steps "
                f"({z:.3g} robust sd above it)")  # .g: a job's 1e308 prints as a number, not 309 digits
    return None


class FaultWatch:
    """What one `detect_faults` call has seen of a run so far, and the checks that read it.

    Why a class: the run folder is read incrementally (metrics records from a byte offset, each
    rank's history kept), and some checks need memory across polls (the last network probe, each
    node's slowest answer since the steps ran late), so every poll costs only what was appended.

    How it decides: each check returns the record or heartbeat it blames and why, or None.
    `detect_faults` asks them in a fixed order each poll, and the first that finds something wins:
    a loss anomaly or a checksum mismatch (the earlier step; a checksum explains the anomaly it
    causes), then a dead rank or a stale heartbeat (`stale_or_dead`: a silent rank over one that
    exited from the broken collective; the node that does not answer a probe over its waiting
    peers), then the job's own terminal state, then a slow link (`slow_node`, before the straggler
    check because a slow link skews every rank's step time), then a straggler."""
    def __init__(self, inp: DetectFaultsInput, run_dir: Path):
        self.inp, self.run_dir = inp, run_dir
        self.offset, self.cut = 0, ""
        self.by_rank: dict[int, list[MetricsRecord]] = {}
        self.checksums: dict[int, dict[int, MetricsRecord]] = {}
        self.rtts: dict[str, float | None] = {}
        self.probed_at = float("-inf")
        self.slowest_rtts: dict[str, float] = {}  # per node, the longest answer since the steps ran late
        self.expected: tuple[Mechanism, ...] = ()
        self.injected_at: float | None = None
        self.false_positives: list[FalsePositive] = []

    def expect(self, kind: str | None, injected_at: float | None) -> None:
        """The injection being watched for: only its own signals will count as its detection."""
        self.expected, self.injected_at = SIGNALS.get(kind or "", ()), injected_at

    def counts(self, mechanism: Mechanism, rank: int | None, step: int | None, why: str) -> bool:
        """Whether a finding is the injected fault's detection; one by another signal is kept (once per
        mechanism and rank) as a false positive, and the watch goes on."""
        if not self.expected or mechanism in self.expected:
            return True
        if not any((fp.mechanism, fp.rank) == (mechanism, rank) for fp in self.false_positives):
            now = time.time()
            self.false_positives.append(FalsePositive(
                mechanism=mechanism, rank=rank, step=step, detected_at=now, evidence=why,
                after_injection_s=None if self.injected_at is None else now - self.injected_at))
        return False

    def result(self, **fields) -> Detection:
        return Detection(expected=list(self.expected), false_positives=self.false_positives, **fields)

    def ingest(self) -> list[MetricsRecord]:
        """The records appended since the last poll (the newest, within the read caps; `cut` says what a
        read left out), kept in a bounded history: each rank its newest, the newest checksum steps."""
        records, self.offset, cut = metrics_since(self.run_dir, self.offset)
        self.cut = cut or self.cut
        for rec in records:
            self.by_rank.setdefault(rec.rank, []).append(rec)
            if rec.param_checksum is not None:
                self.checksums.setdefault(rec.step, {})[rec.rank] = rec
        per_rank = max(MIN_HISTORY, MAX_KEPT_LINES // max(1, len(self.by_rank)))
        for history in self.by_rank.values():
            del history[:-per_rank]
        for step in sorted(self.checksums)[:-MAX_CHECKSUM_STEPS]:
            del self.checksums[step]
        return records

    def loss_anomaly(self, records: list[MetricsRecord]) -> tuple[MetricsRecord, str] | None:
        for rec in records:
            for field in ("loss", "grad_norm"):
                v = getattr(rec, field)
                if field in rec.model_fields_set and (v is None or not math.isfinite(v)):
                    return rec, f"{field}={v} at step {rec.step} on rank {rec.rank}"
            hist = [h.grad_norm for h in self.by_rank.get(rec.rank, [])
                    if h is not rec and h.grad_norm is not None and math.isfinite(h.grad_norm) and h.step < rec.step]
            why = grad_norm_jump(rec, hist, self.inp)
            if why:
                return rec, f"{why} at step {rec.step} on rank {rec.rank}"
        return None

    def every_rank_reached(self, step: int) -> bool:
        return all(recs[-1].step >= step for recs in self.by_rank.values())

    def checksum_mismatch(self) -> tuple[MetricsRecord, str] | None:
        for step in sorted(self.checksums):
            recs = self.checksums[step]
            groups: dict[str, list[MetricsRecord]] = {}
            for rec in recs.values():
                groups.setdefault("all" if rec.replica_group is None else rec.replica_group, []).append(rec)
            for group, members in groups.items():
                values = [m.param_checksum for m in members]
                if len(set(values)) > 1:
                    majority = max(set(values), key=values.count)
                    odd = next(m for m in members if m.param_checksum != majority)
                    return (odd, f"step {step}: rank {odd.rank} checksum {odd.param_checksum} differs from "
                                 f"{majority} in replica group {group}")
        return None

    def rank_medians(self) -> tuple[str, dict[int, float], dict[int, list[MetricsRecord]]]:
        """(field, each rank's median of it over the newest window_steps, those records): compute_time_s
        where every rank times its compute, else step_time_s."""
        recent = {r: [x for x in recs if x.step_time_s is not None][-self.inp.window_steps:]
                  for r, recs in sorted(self.by_rank.items())}
        field = ("compute_time_s" if all(x.compute_time_s is not None for v in recent.values() for x in v)
                 else "step_time_s")
        medians = {r: statistics.median(getattr(x, field) for x in v) for r, v in recent.items() if v}
        return field, medians, recent

    def straggler(self) -> tuple[MetricsRecord, str] | None:
        """With per-rank `compute_time_s`, the slowest compute is the straggler. With only
        `step_time_s` of synchronous ranks, the peers' timers absorb the wait for a rank that is
        late outside its own timer, so a wide spread points at the rank with the *shortest*
        timed step (a slowdown inside every timer shows no spread at all)."""
        if len(self.by_rank) < 2:
            return None
        field, medians, recent = self.rank_medians()
        if any(len(v) < 3 for v in recent.values()):
            return None
        if field == "compute_time_s":
            suspect = max(medians, key=medians.get)
            others = statistics.median(m for r, m in medians.items() if r != suspect)
            if others > 0 and medians[suspect] > self.inp.straggler_ratio * others:
                return (recent[suspect][-1],
                        f"rank {suspect} median compute_time_s {medians[suspect]:.4f}s vs {others:.4f}s on the other "
                        "ranks")
            return None
        suspect = min(medians, key=medians.get)
        others = statistics.median(m for r, m in medians.items() if r != suspect)
        if medians[suspect] > 0 and others > self.inp.straggler_ratio * medians[suspect]:
            return recent[suspect][-1], (f"rank {suspect} median step_time_s {medians[suspect]:.4f}s vs {others:.4f}s "
                                         "on its peers: the peers wait for it in the collective, so it is late outside "
                                         "its own step")
        return None

    def probe(self, hosts: set[str]) -> dict[str, float | None]:
        """Connect round trips to the ranks' nodes, at most one round per PROBE_EVERY_S; only for
        a job on more than one node (one host has no network between its ranks)."""
        if len(hosts) > 1 and time.monotonic() - self.probed_at > PROBE_EVERY_S:
            self.rtts, self.probed_at = probe_nodes(sorted(hosts)), time.monotonic()
        return self.rtts if len(hosts) > 1 else {}

    def slow_node(self) -> tuple[int, Heartbeat, str] | None:
        """Every rank's steps run late against the run's own usual step time (a slow link slows
        the whole collective, so no rank stands out), and one node answers a probe far later
        than the others: that node's link. Returns (a rank on it, its heartbeat, why)."""
        usual = [x.step_time_s for recs in self.by_rank.values() for x in recs[:self.inp.window_steps]
                 if x.step_time_s is not None]
        latest = [recs[-1] for recs in self.by_rank.values()]
        if len(usual) < 3 or len(self.by_rank) < 2:
            return None
        late_s = max(time.time() - max(x.time for x in latest),
                     statistics.median(x.step_time_s or 0.0 for x in latest))
        if late_s < self.inp.straggler_ratio * statistics.median(usual):
            self.slowest_rtts = {}
            return None
        beats = read_heartbeats(self.run_dir)
        # a slow link's queue drains whenever TCP backs off, so one round can miss it: keep each node's worst
        for node, rtt in self.probe(_hosts(beats)).items():
            if rtt is not None:
                self.slowest_rtts[node] = max(rtt, self.slowest_rtts.get(node, 0.0))
        found = slow_outlier(self.slowest_rtts)
        if found is None:
            return None
        node, why = found
        rank = _first_rank_on(beats, node)
        return rank, beats[rank], (f"steps run {late_s:.2f}s against a usual {statistics.median(usual):.3f}s on every "
                                   f"rank; {why}")

    def stale_or_dead(self) -> tuple[str, int, Heartbeat, str] | None:
        beats = read_heartbeats(self.run_dir)
        now = time.time()
        host = os.uname().nodename
        local = {r for r, b in beats.items() if (b.host or host) == host}
        dead = [r for r, b in beats.items()
                if (r in local and b.pid is not None and _proc_state(b.pid) in (None, "Z", "X"))
                or (r not in local and b.exit is not None)]
        if dead:
            # a rank that exited saying why (a broken collective) is collateral; one that
            # vanished without a word is the root cause
            silent = [r for r in dead if beats[r].exit is None]
            # a rank on another node cannot be looked up here: when only collateral exits are seen,
            # the remote rank that said nothing is the one whose node went away
            quiet = sorted((r for r in beats if r not in local and beats[r].exit is None), key=lambda r: beats[r].time)
            if not silent and quiet:
                r = quiet[0]
                b = beats[r]
                return "process_exit", r, b, (f"rank {r} on {b.host} went silent (last heartbeat at step "
                                              f"{b.step}) while rank(s) {dead} exited from the broken "
                                              "collective")
            r = (silent or dead)[0]
            b = beats[r]
            how = "vanished without an exit note" if b.exit is None else f"exited: {b.exit.error}"
            return ("process_exit", r, b, f"rank {r} pid {b.pid} is gone ({how}; last heartbeat at step {b.step})")
        if beats:
            ages = {r: now - b.time for r, b in beats.items()}
            oldest = max(ages, key=ages.get)
            if ages[oldest] > self.inp.heartbeat_stale_s:
                # peers of a hung rank block in its collective and go stale too; a stopped
                # process on this host names the culprit, else the lowest step, then the oldest
                stopped = [r for r, b in beats.items() if (b.host or host) == host and _proc_state(b.pid or 0) == "T"]
                culprit = stopped[0] if stopped else min(beats, key=lambda r: (beats[r].step, -ages[r]))
                how = " (its process is stopped)" if stopped else ""
                silent = [] if stopped else sorted(n for n, rtt in self.probe(_hosts(beats)).items() if rtt is None)
                if silent:  # every rank waits in the collective: the node that does not answer is the cause
                    culprit = _first_rank_on(beats, silent[0])
                    how = f" (its node {silent[0]} does not answer on the network)"
                return ("heartbeat_stale", culprit, beats[culprit],
                        f"rank {culprit}{how} heartbeat is {ages[culprit]:.2f}s old (step "
                        f"{beats[culprit].step}); limit {self.inp.heartbeat_stale_s}s")
        return None


def _hosts(beats: dict[int, Heartbeat]) -> set[str]:
    """The nodes the ranks' heartbeats name."""
    return {b.host for b in beats.values() if b.host}


def _first_rank_on(beats: dict[int, Heartbeat], node: str) -> int:
    return min(r for r, b in beats.items() if b.host == node)


def _proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of a local pid (T = stopped, Z = zombie), or None when it is
    gone. Only read: a heartbeat's pid is the job's claim, never a process to wait on or signal."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
