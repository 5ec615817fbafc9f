"""Fault detection for drills: poll a run (and its job) until something is wrong, and say
what, how it was seen, how long after the injection, and how much to isolate.

Mechanisms: process exit (job state or a rank's pid), heartbeat staleness (hang), loss /
grad-norm anomaly (NaN/inf or a z-score jump), cross-replica parameter checksum mismatch
(silent data corruption; needs a `param_checksum` field in the metrics records, compared
among ranks of the same `replica_group` field when present), per-rank step-time outlier
(straggler; `compute_time_s` when the trainer writes it, else the `step_time_s` spread). On a
multi-node job, network probes of the ranks' nodes (tools/reachability.py) name the node a stall
waits on: one that does not answer (a partition, with the stale heartbeat) or one that answers far
later than the others (a slow link, once the job's steps run late)."""
from __future__ import annotations

import math
import os
import statistics
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainops.run_folder import Heartbeat, MetricsRecord, metrics_since, read_faults, read_heartbeats, read_status
from trainops.tools.base import ToolError, tool
from trainops.tools.schedulers.base import TERMINAL_STATES, SchedulerError, SchedulerKind

# Ranks append their records of one step microseconds to milliseconds apart; a loss anomaly is held
# this long (at most) for the peers' records of its step, whose checksums may name a corrupted replica.
PEER_RECORD_WAIT_S = 1.0
Mechanism = Literal["process_exit", "heartbeat_stale", "loss_anomaly", "checksum_mismatch", "step_time_outlier",
                    "slow_link"]
PROBE_EVERY_S = 0.25
Isolation = Literal["rank", "node", "replica_group", "job"]


class DetectFaultsInput(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    run: str = Field(description="Run id or run folder (inside the workspace) to watch.")
    job_id: str | None = Field(None, description="The run's job, to watch its state too.")
    scheduler: SchedulerKind = "local"
    poll_interval_s: float = Field(0.1, ge=0.05, le=60, description="Seconds between polls (down to 0.05).")
    timeout_s: float = Field(60.0, gt=0, le=86400,
                             description="Stop watching after this many seconds with nothing found (at most a day).")
    heartbeat_stale_s: float = Field(5.0, gt=0, le=86400,
                                     description="A heartbeat older than this (while others are fresher) is a hang.")
    zscore_threshold: float = Field(6.0, gt=0, le=1e6,
                                    description="A grad-norm this many standard deviations above its recent history is "
                                                "an anomaly.")
    straggler_ratio: float = Field(1.5, gt=1, le=1e6,
                                   description="Straggler threshold: the ratio between the slow rank's and its peers' "
                                               "median step (or compute) time.")
    window_steps: int = Field(8, ge=3, le=100_000, description="Steps of history for the z-score and straggler checks.")
    injected_at: float | None = Field(None,
                                      description="Injection wall time; None reads the newest entry of "
                                                  "RUN/faults.jsonl.")


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


_ISOLATION: dict[str, tuple[Isolation, str]] = {
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


def _latest_injection(run_dir: Path) -> float | None:
    faults = read_faults(run_dir)
    return faults[-1].time if faults else None


class _Watch:
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
        self.offset = 0
        self.by_rank: dict[int, list[MetricsRecord]] = {}
        self.checksums: dict[int, dict[int, MetricsRecord]] = {}
        self.last_step_time: dict[int, float] = {}
        self.rtts: dict[str, float | None] = {}
        self.probed_at = float("-inf")
        self.slowest_rtts: dict[str, float] = {}  # per node, the longest answer since the steps ran late

    def ingest(self) -> list[MetricsRecord]:
        records, self.offset = metrics_since(self.run_dir, self.offset)
        for rec in records:
            self.by_rank.setdefault(rec.rank, []).append(rec)
            if rec.param_checksum is not None:
                self.checksums.setdefault(rec.step, {})[rec.rank] = rec
        return records

    def loss_anomaly(self, records: list[MetricsRecord]) -> tuple[MetricsRecord, str] | None:
        for rec in records:
            for field in ("loss", "grad_norm"):
                v = getattr(rec, field)
                if field in rec.model_fields_set and (v is None or not math.isfinite(v)):
                    return rec, f"{field}={v} at step {rec.step} on rank {rec.rank}"
            hist = [h.grad_norm for h in self.by_rank.get(rec.rank, [])
                    if h is not rec and h.grad_norm is not None and h.step < rec.step][-self.inp.window_steps:]
            g = rec.grad_norm
            if len(hist) >= 3 and g is not None:
                sd = statistics.pstdev(hist) or 1e-12
                z = (g - statistics.fmean(hist)) / sd
                if z > self.inp.zscore_threshold and g > 2 * max(hist):
                    return (rec, f"grad_norm {g:.4g} is {z:.1f} sd above the last {len(hist)} steps (mean "
                                 f"{statistics.fmean(hist):.4g})")
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

    def straggler(self) -> tuple[MetricsRecord, str] | None:
        """With per-rank `compute_time_s`, the slowest compute is the straggler. With only
        `step_time_s` of synchronous ranks, the peers' timers absorb the wait for a rank that is
        late outside its own timer, so a wide spread points at the rank with the *shortest*
        timed step (a slowdown inside every timer shows no spread at all)."""
        if len(self.by_rank) < 2:
            return None
        recent = {r: [x for x in recs if x.step_time_s is not None][-self.inp.window_steps:]
                  for r, recs in self.by_rank.items()}
        if any(len(v) < 3 for v in recent.values()):
            return None
        use_compute = all(x.compute_time_s is not None for v in recent.values() for x in v)
        field = "compute_time_s" if use_compute else "step_time_s"
        medians = {r: statistics.median(getattr(x, field) for x in v) for r, v in recent.items()}
        if use_compute:
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
        from trainops.tools.reachability import probe_nodes

        if len(hosts) > 1 and time.monotonic() - self.probed_at > PROBE_EVERY_S:
            self.rtts, self.probed_at = probe_nodes(sorted(hosts)), time.monotonic()
        return self.rtts if len(hosts) > 1 else {}

    def slow_node(self) -> tuple[int, Heartbeat, str] | None:
        """Every rank's steps run late against the run's own usual step time (a slow link slows
        the whole collective, so no rank stands out), and one node answers a probe far later
        than the others: that node's link. Returns (a rank on it, its heartbeat, why)."""
        from trainops.tools.reachability import slow_outlier

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


def _finished_ok(run_dir: Path) -> bool:
    """The launcher writes status.json at the end; a clean finish is not a fault."""
    status = read_status(run_dir)
    return status is not None and status.status == "ok"


def _finish(mechanism: str, rank, node, step, evidence, injected_at, polls) -> Detection:
    now = time.time()
    isolation, recommendation = _ISOLATION[mechanism]
    return Detection(detected=True, mechanism=mechanism, rank=rank, node=node, step=step, detected_at=now,
                     injected_at=injected_at, detection_latency_s=None if injected_at is None else now - injected_at,
                     isolation=isolation, recommendation=recommendation, evidence=evidence, polls=polls)


@tool("detect_faults", risk="read", tags=("faults", "drill"))
def detect_faults(inp: DetectFaultsInput) -> Detection:
    """Watch a run until a fault shows (a rank exits, a heartbeat goes stale, loss or grad norm
    turns NaN or jumps, replica checksums disagree, a rank straggles) or the timeout passes.
    Reports the mechanism, the rank and node, the detection latency from the injection, and
    the isolation to apply (rank, node, replica group or job)."""
    from trainops.workspace import run_folder

    try:
        run_dir = run_folder(inp.run)
    except ValueError as exc:
        raise ToolError("detect_faults", str(exc)) from None
    sched = None
    if inp.job_id:
        from trainops.tools.schedulers import get_scheduler

        sched = get_scheduler(inp.scheduler)
    watch = _Watch(inp, run_dir)
    host = os.uname().nodename
    held, held_since = None, 0.0  # a loss anomaly waiting for every rank's record of its step
    deadline = time.monotonic() + inp.timeout_s
    polls = 0
    while True:
        polls += 1
        injected_at = inp.injected_at if inp.injected_at is not None else _latest_injection(run_dir)
        st = None
        if sched is not None:
            try:
                st = sched.status(inp.job_id)
            except SchedulerError as exc:
                raise ToolError("detect_faults", str(exc)) from None
        if (st is not None and st.state == "completed") or _finished_ok(run_dir):
            return Detection(detected=False, evidence=f"run {inp.run} finished cleanly with no fault seen", polls=polls,
                             injected_at=injected_at)
        records = watch.ingest()
        if held is None:
            anomaly = watch.loss_anomaly(records)
            held, held_since = ((*anomaly, "loss_anomaly"), time.monotonic()) if anomaly else (None, 0.0)
        # a corrupted replica explains the loss anomaly it causes: the earlier step wins, the checksum on a tie
        findings = [(rec, why, "checksum_mismatch") for rec, why in filter(None, [watch.checksum_mismatch()])]
        findings += [held] if held else []
        if findings:
            rec, why, mechanism = min(findings, key=lambda f: f[0].step)
            step = rec.step
            if (mechanism == "loss_anomaly" and not watch.every_rank_reached(step)
                    and time.monotonic() - held_since < min(PEER_RECORD_WAIT_S, inp.heartbeat_stale_s)):
                time.sleep(inp.poll_interval_s)  # a peer's checksum of this step may yet explain the anomaly
                continue
            node = (rec.host or host) if mechanism == "checksum_mismatch" else None
            return _finish(mechanism, rec.rank, node, rec.step, why, injected_at or rec.time, polls)
        dead = watch.stale_or_dead()
        if dead:
            mechanism, rank, beat, why = dead
            return _finish(mechanism, rank, beat.host or host, beat.step, why, injected_at, polls)
        if st is not None and st.state in TERMINAL_STATES:
            node = st.nodes[0] if st.nodes else None
            return _finish("process_exit", None, node, None,
                           f"job {inp.job_id} is {st.state} (exit code {st.exit_code}; {st.reason})", injected_at,
                           polls)
        slow = watch.slow_node()  # before the straggler check: a slow link skews the ranks' step times too
        if slow:
            rank, beat, why = slow
            return _finish("slow_link", rank, beat.host, beat.step, why, injected_at, polls)
        found = watch.straggler()
        if found:
            rec, why = found
            return _finish("step_time_outlier", rec.rank, rec.host or host, rec.step, why, injected_at, polls)
        if time.monotonic() >= deadline:
            return Detection(detected=False, evidence=f"nothing abnormal in {inp.timeout_s}s of watching {run_dir}",
                             polls=polls, injected_at=injected_at)
        time.sleep(inp.poll_interval_s)
