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

import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from trainops.run_folder import RunFiles
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
    path = RunFiles(run_dir).faults
    if not path.exists():
        return None
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    return float(json.loads(lines[-1])["time"]) if lines else None


class _Watch:
    def __init__(self, inp: DetectFaultsInput, run_dir: Path):
        self.inp, self.run_dir = inp, run_dir
        self.offset = 0
        self.by_rank: dict[int, list[dict]] = {}
        self.checksums: dict[int, dict[int, dict]] = {}
        self.last_step_time: dict[int, float] = {}
        self.rtts: dict[str, float | None] = {}
        self.probed_at = float("-inf")
        self.slowest_rtts: dict[str, float] = {}  # per node, the longest answer since the steps ran late

    def ingest(self) -> list[dict]:
        from trainops.tools.monitoring.embedded import read_records

        records, self.offset = read_records(self.run_dir, self.offset)
        for rec in records:
            r = int(rec.get("rank", 0))
            self.by_rank.setdefault(r, []).append(rec)
            if "param_checksum" in rec:
                self.checksums.setdefault(int(rec["step"]), {})[r] = rec
        return records

    def loss_anomaly(self, records: list[dict]) -> tuple[dict, str] | None:
        for rec in records:
            for field in ("loss", "grad_norm"):
                v = rec.get(field)
                if v is None or (isinstance(v, float) and not math.isfinite(v)) or v in ("nan", "inf", "NaN",
                                                                                         "Infinity"):
                    if field in rec:
                        return rec, f"{field}={v} at step {rec.get('step')} on rank {rec.get('rank')}"
            hist = [float(h["grad_norm"]) for h in self.by_rank.get(int(rec.get("rank", 0)), [])
                    if h is not rec and isinstance(h.get("grad_norm"), (int, float))
                    and int(h["step"]) < int(rec["step"])][-self.inp.window_steps:]
            g = rec.get("grad_norm")
            if len(hist) >= 3 and isinstance(g, (int, float)):
                sd = statistics.pstdev(hist) or 1e-12
                z = (float(g) - statistics.fmean(hist)) / sd
                if z > self.inp.zscore_threshold and float(g) > 2 * max(hist):
                    return (rec, f"grad_norm {g:.4g} is {z:.1f} sd above the last {len(hist)} steps (mean "
                                 f"{statistics.fmean(hist):.4g})")
        return None

    def every_rank_reached(self, step: int) -> bool:
        return all(int(recs[-1].get("step", 0)) >= step for recs in self.by_rank.values())

    def checksum_mismatch(self) -> tuple[dict, str] | None:
        for step in sorted(self.checksums):
            recs = self.checksums[step]
            groups: dict[str, list[dict]] = {}
            for rec in recs.values():
                groups.setdefault(str(rec.get("replica_group", "all")), []).append(rec)
            for group, members in groups.items():
                values = [m["param_checksum"] for m in members]
                if len(set(values)) > 1:
                    majority = max(set(values), key=values.count)
                    odd = next(m for m in members if m["param_checksum"] != majority)
                    return (odd, f"step {step}: rank {odd.get('rank')} checksum {odd['param_checksum']} differs from "
                                 f"{majority} in replica group {group}")
        return None

    def straggler(self) -> tuple[dict, str] | None:
        """With per-rank `compute_time_s`, the slowest compute is the straggler. With only
        `step_time_s` of synchronous ranks, the peers' timers absorb the wait for a rank that is
        late outside its own timer, so a wide spread points at the rank with the *shortest*
        timed step (a slowdown inside every timer shows no spread at all)."""
        if len(self.by_rank) < 2:
            return None
        recent = {r: recs[-self.inp.window_steps:] for r, recs in self.by_rank.items()}
        if any(len(v) < 3 for v in recent.values()):
            return None
        use_compute = all("compute_time_s" in x for v in recent.values() for x in v)
        field = "compute_time_s" if use_compute else "step_time_s"
        medians = {r: statistics.median(float(x[field]) for x in v) for r, v in recent.items()}
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

    def slow_node(self) -> tuple[int, dict, str] | None:
        """Every rank's steps run late against the run's own usual step time (a slow link slows
        the whole collective, so no rank stands out), and one node answers a probe far later
        than the others: that node's link. Returns (a rank on it, its heartbeat, why)."""
        from trainops.tools.monitoring.embedded import read_heartbeats
        from trainops.tools.reachability import slow_outlier

        usual = [float(x["step_time_s"]) for recs in self.by_rank.values() for x in recs[:self.inp.window_steps]
                 if "step_time_s" in x]
        latest = [recs[-1] for recs in self.by_rank.values()]
        if len(usual) < 3 or len(self.by_rank) < 2:
            return None
        late_s = max(time.time() - max(float(x.get("time", 0)) for x in latest),
                     statistics.median(float(x.get("step_time_s", 0)) for x in latest))
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

    def stale_or_dead(self) -> tuple[str, int, dict, str] | None:
        from trainops.tools.monitoring.embedded import read_heartbeats

        beats = read_heartbeats(self.run_dir)
        now = time.time()
        host = os.uname().nodename
        local = {r for r, b in beats.items() if b.get("host", host) == host}
        dead = [r for r, b in sorted(beats.items())
                if (r in local and "pid" in b and _proc_state(int(b["pid"])) in (None, "Z", "X"))
                or (r not in local and "exit" in b)]
        if dead:
            # a rank that exited saying why (a broken collective) is collateral; one that
            # vanished without a word is the root cause
            silent = [r for r in dead if "exit" not in beats[r]]
            # a rank on another node cannot be looked up here: when only collateral exits are seen,
            # the remote rank that said nothing is the one whose node went away
            quiet = sorted((r for r in beats if r not in local and "exit" not in beats[r]),
                           key=lambda r: float(beats[r].get("time", 0)))
            if not silent and quiet:
                r = quiet[0]
                b = beats[r]
                return "process_exit", r, b, (f"rank {r} on {b.get('host')} went silent (last heartbeat at step "
                                              f"{b.get('step')}) while rank(s) {dead} exited from the broken "
                                              "collective")
            r = (silent or dead)[0]
            b = beats[r]
            how = "vanished without an exit note" if "exit" not in b else f"exited: {b['exit'].get('error')}"
            return ("process_exit", r, b,
                    f"rank {r} pid {b['pid']} is gone ({how}; last heartbeat at step {b.get('step')})")
        if beats:
            ages = {r: now - float(b["time"]) for r, b in beats.items()}
            oldest = max(ages, key=ages.get)
            if ages[oldest] > self.inp.heartbeat_stale_s:
                # peers of a hung rank block in its collective and go stale too; a stopped
                # process on this host names the culprit, else the lowest step, then the oldest
                stopped = [r for r, b in beats.items() if b.get("host", host) == host
                           and _proc_state(int(b.get("pid", 0))) == "T"]
                culprit = stopped[0] if stopped else min(beats, key=lambda r: (beats[r].get("step", 0), -ages[r]))
                how = " (its process is stopped)" if stopped else ""
                silent = [] if stopped else sorted(n for n, rtt in self.probe(_hosts(beats)).items() if rtt is None)
                if silent:  # every rank waits in the collective: the node that does not answer is the cause
                    culprit = _first_rank_on(beats, silent[0])
                    how = f" (its node {silent[0]} does not answer on the network)"
                return ("heartbeat_stale", culprit, beats[culprit],
                        f"rank {culprit}{how} heartbeat is {ages[culprit]:.2f}s old (step "
                        f"{beats[culprit].get('step')}); limit {self.inp.heartbeat_stale_s}s")
        return None


def _hosts(beats: dict[int, dict]) -> set[str]:
    """The nodes the ranks' heartbeats name."""
    return {str(b["host"]) for b in beats.values() if b.get("host")}


def _first_rank_on(beats: dict[int, dict], node: str) -> int:
    return min(r for r, b in beats.items() if b.get("host") == node)


def _proc_state(pid: int) -> str | None:
    """The kernel's one-letter state of a local pid (T = stopped, Z = zombie), or None when it is
    gone. Only read: a heartbeat's pid is the job's claim, never a process to wait on or signal."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _finished_ok(run_dir: Path) -> bool:
    """The launcher writes status.json at the end; a clean finish is not a fault."""
    try:
        return json.loads(RunFiles(run_dir).status.read_text()).get("status") == "ok"
    except (OSError, ValueError):
        return False


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
            rec, why, mechanism = min(findings, key=lambda f: int(f[0].get("step", 0)))
            step = int(rec.get("step", 0))
            if (mechanism == "loss_anomaly" and not watch.every_rank_reached(step)
                    and time.monotonic() - held_since < min(PEER_RECORD_WAIT_S, inp.heartbeat_stale_s)):
                time.sleep(inp.poll_interval_s)  # a peer's checksum of this step may yet explain the anomaly
                continue
            node = rec.get("host", host) if mechanism == "checksum_mismatch" else None
            return _finish(mechanism, rec.get("rank"), node, rec.get("step"), why, injected_at or rec.get("time"),
                           polls)
        dead = watch.stale_or_dead()
        if dead:
            mechanism, rank, beat, why = dead
            return _finish(mechanism, rank, beat.get("host", host), beat.get("step"), why, injected_at, polls)
        if st is not None and st.state in TERMINAL_STATES:
            node = st.nodes[0] if st.nodes else None
            return _finish("process_exit", None, node, None,
                           f"job {inp.job_id} is {st.state} (exit code {st.exit_code}; {st.reason})", injected_at,
                           polls)
        slow = watch.slow_node()  # before the straggler check: a slow link skews the ranks' step times too
        if slow:
            rank, beat, why = slow
            return _finish("slow_link", rank, beat.get("host"), beat.get("step"), why, injected_at, polls)
        found = watch.straggler()
        if found:
            rec, why = found
            return _finish("step_time_outlier", rec.get("rank"), rec.get("host", host), rec.get("step"), why,
                           injected_at, polls)
        if time.monotonic() >= deadline:
            return Detection(detected=False, evidence=f"nothing abnormal in {inp.timeout_s}s of watching {run_dir}",
                             polls=polls, injected_at=injected_at)
        time.sleep(inp.poll_interval_s)
