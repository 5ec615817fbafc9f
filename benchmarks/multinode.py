"""Multi-node figures on a `trainops sandbox` Slurm cluster of network-namespace nodes (root; Linux):
bring-up of 3 nodes, the cold start of a 2-node training job, node-crash and partition drills
(detection latency, recovery onto the hot spare against that cold start; a node crash recovered in
process onto the job's own spare node against that job's cold start), and how often a slow
node link is pinned on the right node. `python -m trainops.benchmarks.multinode` rewrites its own
section of RESULTS.md."""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from trainops.benchmarks.harness import Figure, Suite, ratios, render, write_section
from trainops.benchmarks.suite import median_phases
from trainops.run_records import read_drill_record, read_heartbeat, read_metrics
from trainops.skills.drill.drill import drill
from trainops.skills.request import JobRequest
from trainops.tools.calls import invoke
from trainops.tools.context import operator_session
from trainops.tools.jobs import jobs
from trainops.tools.reliability import detection, faults, signals
from trainops.tools.sandbox import cluster as sandbox
from trainops.tools.schedulers.base import TrainingJob

BEGIN, END = "<!-- multinode:begin -->", "<!-- multinode:end -->"
SPEC = sandbox.SandboxSpec(nodes=3, prefix="tosb", net="10.251.11")
JOB = ["training.steps=60", "data.kind=synthetic", "checkpoint.enable=true", "checkpoint.interval=3"]
IN_PROCESS = ["resilience.in_process_restart=true", "resilience.spare_nodes=1", "resilience.warm_spares=0",
              "resilience.collective_timeout_s=10"]
"""The same job with in-process restart across nodes: it holds the third node as its spare node."""


def bring_up(repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        sandbox.down(SPEC.prefix)
        samples.append(sandbox.up(SPEC).bring_up_s)
    return samples


def cold_start(extra: tuple[str, ...] = ()) -> float:
    """Seconds from submit_job to the first step of a 2-node job (the job is then cancelled)."""
    started = time.time()
    out = invoke(jobs.submit_job, jobs.SubmitJobInput(scheduler="slurm", name="cold", training=TrainingJob(
        preset="tiny", nproc=1, nodes=2, overrides=[*JOB, *extra])))
    deadline = time.monotonic() + 180
    while not (records := read_metrics(out.handle.run_dir)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"cold start: no step in {out.handle.run_dir} after 180 s")
        time.sleep(0.05)
    first = min(record.time for record in records)
    invoke(jobs.cancel_job, jobs.CancelJobInput(scheduler="slurm", job_id=out.handle.job_id, force=True))
    return first - started


def _all_idle() -> None:
    sandbox.wait_until(60, "every node idle", lambda: set(sandbox.node_states(sandbox.load_state(SPEC.prefix)).values())
                       == {"idle"})


def node_drill(fault: str = "node-crash", extra: tuple[str, ...] = ()):
    _all_idle()
    req = JobRequest(preset="tiny", nproc=1, nodes=2, scheduler="slurm", timeout_s=240, overrides=[*JOB, *extra])
    result, _ = drill(req, fault, inject_step=4)
    return result


def slurm_flagged_s(result) -> str:
    """When Slurm first called the lost node not responding, from the drill's per-node timeline."""
    timeline = read_drill_record(result.run_dir).node_timeline or []
    lost = next(e.node for e in timeline if e.event.startswith("injected"))
    flagged = [e.t_s for e in timeline if e.node == lost and e.t_s > 0
               and ("not_responding" in e.event or e.event.startswith("slurm: down"))]
    return f"{flagged[0]:.1f} s" if flagged else "never"


def slow_node_named() -> tuple[bool, float]:
    """One run: a 2-node job's last node gets a 1 Mbit/s link; is that the node detect_faults names,
    and how long after the rate limit? (Detection only: the drill's recovery is timed elsewhere.)"""
    _all_idle()
    out = invoke(jobs.submit_job, jobs.SubmitJobInput(scheduler="slurm", name="slow", training=TrainingJob(
        preset="tiny", nproc=1, nodes=2, overrides=["training.steps=2000", "data.kind=synthetic"])))
    job_id, run_dir = out.handle.job_id, out.handle.run_dir
    sandbox.wait_until(180, "step 3 on both nodes", lambda: (beat := read_heartbeat(run_dir, 1)) is not None
                       and beat.step >= 3)
    slow = invoke(jobs.job_status, jobs.JobRef(scheduler="slurm", job_id=job_id)).nodes[-1]
    try:
        injected = invoke(faults.inject_fault, faults.InjectFaultInput(kind="slow_network", node=slow, run=run_dir))
        found = invoke(detection.detect_faults, signals.DetectFaultsInput(
            run=run_dir, job_id=job_id, scheduler="slurm", poll_interval_s=0.05, injected_at=injected.injected_at,
            timeout_s=30))
    finally:
        invoke(jobs.cancel_job, jobs.CancelJobInput(scheduler="slurm", job_id=job_id, force=True))
        invoke(faults.inject_fault, faults.InjectFaultInput(kind="heal_node", node=slow))
    return found.node == slow and found.mechanism == "slow_link", found.detection_latency_s or 30.0


def run(repeats: int, slow_runs: int) -> Suite:
    suite = Suite()
    with tempfile.TemporaryDirectory() as home, operator_session():
        os.environ["TRAINOPS_HOME"] = home
        try:
            suite.add(Figure("sandbox bring-up, 3 namespace nodes to all idle", bring_up(repeats), "s",
                             target="<= 15 s"))
            state = sandbox.load_state(SPEC.prefix)
            os.environ.update(SLURM_CONF=str(state.conf), GLOO_SOCKET_IFNAME=sandbox.NODE_IF)
            colds, drills, partitions, spared_colds, spared = [], [], [], [], []
            for _ in range(repeats):  # interleaved, so drift on a shared host hits both alike
                colds.append(cold_start())
                drills.append(node_drill("node-crash"))
                partitions.append(node_drill("partition"))
                spared_colds.append(cold_start(tuple(IN_PROCESS)))
                spared.append(node_drill("node-crash", tuple(IN_PROCESS)))
            suite.add(Figure("2-node job cold start (submit to first step)", colds, "s"))
            suite.add(Figure("node crash detected (job signals, not SlurmdTimeout)",
                             [d.detection_latency_s for d in drills], "s", target="<= 1 s"))
            recovery = ratios([d.recovery_time_s for d in drills], colds)
            suite.add(Figure("recovery onto the hot spare / cold start", recovery, "x", target="<= 1.3",
                             note="recovery = detection to the first step after the restart on the remaining "
                                  "node and the spare: the forced cancel waits COMPLETING_GRACE_S (2 s) for the "
                                  "dead node's steps, then the job is submitted again with the dead node drained "
                                  "(instead of waiting ~20 s for Slurm to declare it down) and loads its newest "
                                  f"checkpoint; steps lost {[d.steps_lost for d in drills]}"))
            suite.add(Figure("node crash recovered in process onto the job's spare node / cold start", ratios(
                [d.recovery_time_s for d in spared], spared_colds), "x", target="<= 0.7",
                note=f"recovery {statistics.median(d.recovery_time_s for d in spared):.2f} s by "
                     f"{', '.join(sorted({d.recovery_path or 'unknown' for d in spared}))} vs cold start "
                     f"{statistics.median(spared_colds):.2f} s of the same job (2 training nodes + 1 spare node, one "
                     "supervisor step per node); phases: "
                     f"{median_phases([d.recovery_phases_s for d in spared])}; steps lost "
                     f"{[d.steps_lost for d in spared]}"))
            suite.add(Figure("partition detected (stale heartbeat, node named by a probe)",
                             [d.detection_latency_s for d in partitions], "s", target="<= 6 s",
                             note="heartbeat timeout 5 s + 1 s; Slurm's own NOT_RESPONDING came "
                                  f"{', '.join(slurm_flagged_s(d) for d in partitions)} after the fault "
                                  "(recorded as confirmation)"))
            suite.add(Figure("partition recovery onto the hot spare / cold start",
                             ratios([d.recovery_time_s for d in partitions], colds), "x"))
            named = [slow_node_named() for _ in range(slow_runs)]
            right = sum(ok for ok, _ in named)
            suite.add(Figure(f"slow node link named correctly (of {slow_runs} runs)", [right], "runs",
                             target=f"{slow_runs} of {slow_runs}", passed=right == slow_runs,
                             note="1 Mbit/s tbf on the last node's link; named by detect_faults' slow_link check "
                                  "(steps late on every rank, then connect probes of each node's slurmd)"))
            suite.add(Figure("slow node link detected", [latency for _, latency in named], "s"))
        finally:
            sandbox.down(SPEC.prefix)
    for fig in suite.figures:
        if fig.target and fig.passed is None:
            limit = float(fig.target.split()[1])
            fig.passed = fig.median <= limit
    return suite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slow-runs", type=int, default=10, help="runs of the slow-link naming check")
    args = parser.parse_args(argv)
    suite = run(args.repeats, args.slow_runs)
    path = write_section(render(suite, "## Multi-node on a sandbox cluster (`python -m trainops.benchmarks.multinode`)",
                                BEGIN, END), BEGIN, END)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
