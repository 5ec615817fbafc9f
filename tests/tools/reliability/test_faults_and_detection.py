"""Fault injection and detection on live processes. The ranks here are a stand-in for the
trainer (a few lines that write heartbeats and metrics records the way trainer/metrics.py
does), so each mechanism is exercised in a second; the trainer-driven drill is in
tests/integration."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import psutil
import pytest

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.schedulers.local import pid_alive
from trainops.trainer.config import load_config

OPERATOR = CallContext(actor="operator")  # mutate tools called by an operator need no approval token

RANK_SCRIPT = r"""
import json, math, os, sys, time
run_dir, rank, step_s, nan_step = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
os.makedirs(f"{run_dir}/heartbeat", exist_ok=True)
for step in range(1, 100000):
    time.sleep(step_s)
    loss = float("nan") if step == nan_step else 5.0 / step
    rec = {"step": step, "rank": rank, "loss": loss, "grad_norm": 1.0, "step_time_s": step_s, "compute_time_s": step_s,
           "time": time.time()}
    with open(f"{run_dir}/metrics.jsonl", "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    tmp = f"{run_dir}/heartbeat/rank{rank}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"step": step, "time": time.time(), "pid": os.getpid()}, fh)
    os.replace(tmp, f"{run_dir}/heartbeat/rank{rank}.json")
"""


LAUNCHER = r"""
import os, subprocess, sys
run_dir, script, nan_step, step_s = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
procs = [subprocess.Popen([sys.executable, "-c", script, run_dir, str(r), s, nan_step],
                          env={**os.environ, "RANK": str(r)}) for r, s in enumerate(step_s)]
for p in procs:
    p.wait()
"""


@pytest.fixture
def ranks(workspace):
    """Start stand-in ranks of run 'drill' as one local job (inject_fault signals only a job's own
    processes, found by the RANK variable as torchrun sets it): ranks(step_s=[...], nan_step=...)."""
    jobs = []
    run_dir = workspace / "runs" / "drill"
    run_dir.mkdir(parents=True)

    def start(step_s=(0.02, 0.02), nan_step=-1):
        command = [sys.executable, "-c", LAUNCHER, str(run_dir), RANK_SCRIPT, str(nan_step), *map(str, step_s)]
        spec = {"name": "drill", "command": command, "run_dir": str(run_dir)}
        jobs.append(call("submit_job", {"spec": spec}, OPERATOR).handle.job_id)
        deadline = time.monotonic() + 20
        while len(list((run_dir / "heartbeat").glob("rank*.json"))) < len(step_s):
            assert time.monotonic() < deadline, "stand-in ranks did not start"
            time.sleep(0.02)
        return run_dir

    yield start
    for job_id in jobs:
        call("cancel_job", {"job_id": job_id, "force": True}, OPERATOR)


def test_a_killed_rank_is_detected_as_process_exit_with_its_latency(ranks):
    run_dir = ranks()
    injected = call("inject_fault", {"kind": "kill_rank", "run": "drill", "rank": 1}, OPERATOR)
    found = call("detect_faults", {"run": "drill", "poll_interval_s": 0.05, "timeout_s": 10})
    assert (found.detected, found.mechanism, found.rank, found.isolation) == (True, "process_exit", 1, "node")
    assert found.injected_at == pytest.approx(injected.injected_at)
    assert 0 <= found.detection_latency_s < 2.0
    assert json.loads((run_dir / "faults.jsonl").read_text().splitlines()[-1])["kind"] == "kill_rank"


def test_an_injection_time_is_no_later_than_the_fault_it_injected(ranks, monkeypatch):
    """A supervisor sees a SIGKILLed rank gone at once and times its detection then; a drill that read
    its clock after the signal, having lost the CPU in between (a loaded host), had injected the fault
    after it was detected, and found no in-process recovery detected since (a CI failure). Here the
    drill loses the CPU right after its signal, while a watcher sees the rank gone."""
    ranks()
    seen_gone: list[float] = []
    send_signal = psutil.Process.send_signal

    def signal_then_lose_the_cpu(proc: psutil.Process, sig: int) -> None:
        send_signal(proc, sig)
        while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
            time.sleep(0.005)
        seen_gone.append(time.time())  # the supervisor's detection, as early as it can be
        time.sleep(0.2)

    monkeypatch.setattr(psutil.Process, "send_signal", signal_then_lose_the_cpu)
    injected = call("inject_fault", {"kind": "kill_rank", "run": "drill", "rank": 1}, OPERATOR)
    assert injected.injected_at <= seen_gone[0]


def test_killing_a_node_kills_every_rank_it_hosts(ranks):
    ranks(step_s=(0.02, 0.02, 0.02))
    out = call("inject_fault", {"kind": "kill_node", "run": "drill"}, OPERATOR)
    assert len(out.pids) == 3 and out.target.endswith("ranks [0, 1, 2]")
    deadline = time.monotonic() + 5
    while any(pid_alive(pid) for pid in out.pids):
        assert time.monotonic() < deadline, "a rank survived kill_node"
        time.sleep(0.05)


def test_killing_a_node_the_job_does_not_run_on_is_refused(ranks):
    ranks()
    with pytest.raises(ToolError, match="no running rank of the job for .* is on node 'elsewhere'"):
        call("inject_fault", {"kind": "kill_node", "run": "drill", "node": "elsewhere"}, OPERATOR)


def test_a_hung_rank_is_detected_by_its_stale_heartbeat(ranks):
    ranks()
    injected = call("inject_fault", {"kind": "hang", "run": "drill", "rank": 0}, OPERATOR)
    try:
        watch = {"run": "drill", "poll_interval_s": 0.05, "heartbeat_stale_s": 0.5, "timeout_s": 10}
        found = call("detect_faults", watch)
    finally:
        os.kill(injected.pids[0], signal.SIGCONT)
    assert (found.mechanism, found.rank) == ("heartbeat_stale", 0)
    assert 0.4 <= found.detection_latency_s < 2.5  # the last beat predates the injection by up to a step


def test_a_nan_loss_is_a_loss_anomaly_that_isolates_the_job(ranks):
    ranks(nan_step=5)
    found = call("detect_faults", {"run": "drill", "poll_interval_s": 0.05, "timeout_s": 10})
    assert (found.mechanism, found.step, found.isolation) == ("loss_anomaly", 5, "job")


def test_a_rank_with_slow_compute_is_a_step_time_outlier(ranks):
    ranks(step_s=(0.02, 0.02, 0.1))
    found = call("detect_faults", {"run": "drill", "poll_interval_s": 0.05, "timeout_s": 10, "straggler_ratio": 2.0})
    assert (found.mechanism, found.rank) == ("step_time_outlier", 2)


def test_in_synchronous_steps_the_rank_late_outside_its_timer_is_the_straggler(workspace):
    run_dir = workspace / "runs" / "sync"
    run_dir.mkdir(parents=True)
    now = time.time()
    lines = [{"step": s, "rank": r, "loss": 1.0, "grad_norm": 1.0, "step_time_s": 0.15 if r == 1 else 0.45, "time": now}
             for s in range(1, 5) for r in range(3)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    found = call("detect_faults", {"run": "sync", "timeout_s": 0.2})
    assert (found.mechanism, found.rank) == ("step_time_outlier", 1)


def test_diverging_replica_checksums_are_silent_data_corruption(workspace):
    run_dir = workspace / "runs" / "sdc"
    run_dir.mkdir(parents=True)
    now = time.time()
    lines = [{"step": 3, "rank": r, "loss": 1.0, "grad_norm": 1.0, "step_time_s": 0.1, "time": now, "param_checksum": c}
             for r, c in enumerate(["aa", "aa", "ff", "aa"])]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    found = call("detect_faults", {"run": "sdc", "timeout_s": 1, "injected_at": now - 0.25})
    assert (found.mechanism, found.rank, found.isolation) == ("checksum_mismatch", 2, "replica_group")
    assert found.detection_latency_s >= 0.25


def test_a_grad_spike_waits_for_the_peer_whose_checksum_of_the_same_step_explains_it(workspace):
    """The flipped replica reports its step first, with a grad-norm spike; its peer's record of the
    same step (the checksum to compare with) lands a moment later. The spike must not be reported
    as a job-wide loss anomaly before the peer's record is read (seen in CI: 1 drill in ~40)."""
    run_dir = workspace / "runs" / "sdc-race"
    run_dir.mkdir(parents=True)
    metrics = run_dir / "metrics.jsonl"

    def rec(step, rank, grad_norm, checksum):
        return json.dumps({"step": step, "rank": rank, "loss": 4.0, "grad_norm": grad_norm, "step_time_s": 0.1,
                           "time": time.time(), "param_checksum": checksum, "replica_group": "dp"}) + "\n"

    history = [rec(s, r, 1.3 + 0.05 * s, 1000.0 + s) for s in range(1, 5) for r in (0, 1)]
    metrics.write_text("".join(history) + rec(5, 1, 3.3, -1.5e37))
    late_peer = threading.Timer(0.3, lambda: metrics.open("a").write(rec(5, 0, 3.3, 1005.0)))
    late_peer.start()
    try:
        found = call("detect_faults", {"run": "sdc-race", "poll_interval_s": 0.05, "timeout_s": 3})
    finally:
        late_peer.join()
    assert (found.mechanism, found.rank, found.step) == ("checksum_mismatch", 1, 5)


def test_a_healthy_run_reports_nothing_within_the_timeout(ranks):
    ranks()
    found = call("detect_faults", {"run": "drill", "poll_interval_s": 0.05, "timeout_s": 0.5})
    assert not found.detected and found.polls >= 5


def test_launch_time_faults_return_the_trainer_overrides():
    out = call("inject_fault", {"kind": "straggler", "rank": 1, "slow_ms": 300}, OPERATOR)
    assert out.overrides == ["faults.slow_rank=1", "faults.slow_ms=300"] and out.injected_at is None

    cfg = load_config(None, "tiny", call("inject_fault", {"kind": "bitflip", "rank": 1, "step": 4}, OPERATOR).overrides)
    assert (cfg.faults.bitflip_step, cfg.faults.bitflip_rank) == (4, 1)


def test_corrupting_the_newest_checkpoint_changes_its_largest_file_and_skips_an_unfinished_write(workspace):
    ckpt = workspace / "runs" / "ck" / "checkpoints"
    for step in ("step-00000002", "step-00000004", "step-00000006.tmp"):
        (ckpt / step).mkdir(parents=True)
        (ckpt / step / "__0_0.distcp").write_bytes(bytes(1000))
        if not step.endswith(".tmp"):
            (ckpt / step / "COMMIT.json").write_text('{"time": 1.0}')
    out = call("inject_fault", {"kind": "corrupt_checkpoint", "run": "ck"}, OPERATOR)
    assert out.target.endswith("step-00000004/__0_0.distcp")  # the in-flight write would commit the damage
    assert (ckpt / "step-00000004" / "__0_0.distcp").read_bytes() != bytes(1000)
    assert (ckpt / "step-00000002" / "__0_0.distcp").read_bytes() == bytes(1000)
    assert (ckpt / "step-00000006.tmp" / "__0_0.distcp").read_bytes() == bytes(1000)


def test_killing_a_rank_of_an_unknown_run_names_the_run():
    with pytest.raises(ToolError, match="run 'ghost' not found"):
        call("inject_fault", {"kind": "kill_rank", "run": "ghost"}, OPERATOR)
