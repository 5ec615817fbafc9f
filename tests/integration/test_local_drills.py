"""Fault drills on the real trainer through the local scheduler (no services needed): a
killed rank, a hung rank and an injected NaN are each detected, with their latency."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from trainops.run_records import read_heartbeats
from trainops.tools.calls import call

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("as_operator")]

TINY = ["training.seq_len=64", "training.global_batch=4", "training.micro_batch=2"]


def _start(steps: int, *extra: str) -> tuple[str, Path]:
    out = call("submit_job", {"name": "drill", "training": {"preset": "tiny", "nproc": 2,
                                                            "overrides": [f"training.steps={steps}", *TINY, *extra]}})
    return out.handle.job_id, Path(out.handle.run_dir)


def _wait_for_ranks(run_dir: Path, ranks: int = 2, timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        beats = read_heartbeats(run_dir)
        if len(beats) == ranks and all(b.step >= 1 for b in beats.values()):
            return beats
        time.sleep(0.2)
    raise AssertionError(f"{ranks} ranks did not take a step in {timeout_s}s")


def test_a_killed_trainer_rank_is_detected_within_a_second(workspace):
    job_id, run_dir = _start(3000)
    try:
        _wait_for_ranks(run_dir)
        injected = call("inject_fault", {"kind": "kill_rank", "run": str(run_dir), "rank": 1})
        found = call("detect_faults", {"run": str(run_dir), "job_id": job_id, "poll_interval_s": 0.05, "timeout_s": 30})
        assert (found.mechanism, found.rank) == ("process_exit", 1)
        assert found.injected_at == pytest.approx(injected.injected_at) and found.detection_latency_s < 1.0
        assert call("wait_job", {"job_id": job_id, "timeout_s": 60}).state == "failed"
    finally:
        call("cancel_job", {"job_id": job_id})


def test_a_hung_trainer_rank_is_detected_by_its_heartbeat(workspace):
    job_id, run_dir = _start(3000)
    try:
        _wait_for_ranks(run_dir)
        injected = call("inject_fault", {"kind": "hang", "run": str(run_dir), "rank": 0})
        found = call("detect_faults", {"run": str(run_dir), "job_id": job_id, "poll_interval_s": 0.05,
                                       "heartbeat_stale_s": 2.0, "timeout_s": 30})
        assert (found.mechanism, found.rank, found.isolation) == ("heartbeat_stale", 0, "node")
        assert "stopped" in found.evidence
        assert 1.0 <= found.detection_latency_s < 4.0
        os.kill(injected.pids[0], signal.SIGCONT)
    finally:
        call("cancel_job", {"job_id": job_id})


def test_an_injected_nan_is_a_loss_anomaly_at_its_step(workspace):
    overrides = call("inject_fault", {"kind": "nan", "step": 4}).overrides
    job_id, run_dir = _start(20, *overrides)
    found = call("detect_faults", {"run": str(run_dir), "job_id": job_id, "poll_interval_s": 0.05, "timeout_s": 180,
                                   "fault_kind": "nan"})
    assert (found.mechanism, found.step, found.isolation) == ("loss_anomaly", 4, "job")
    assert 0 <= found.detection_latency_s < 2.0
    assert call("wait_job", {"job_id": job_id, "timeout_s": 60}).state == "failed"


def test_a_straggler_rank_is_named_from_the_step_time_spread(workspace):
    overrides = call("inject_fault", {"kind": "straggler", "rank": 1, "slow_ms": 300}).overrides
    job_id, run_dir = _start(40, *overrides)
    try:
        found = call("detect_faults", {"run": str(run_dir), "job_id": job_id, "poll_interval_s": 0.1, "timeout_s": 180})
        assert (found.mechanism, found.rank, found.isolation) == ("step_time_outlier", 1, "node")
    finally:
        call("cancel_job", {"job_id": job_id})


def test_a_flipped_bit_on_one_replica_is_a_checksum_mismatch_in_its_replica_group(workspace):
    """DDP replicas hold identical parameters after every step; the bit flipped on rank 1 after
    step 4 must show as that rank's checksum disagreeing with its group, at step 4. The fault is
    scheduled, so faults.jsonl names it only once it fires: the watch is told its kind, as the drill
    tells it, or a loaded host's step-time spread before step 4 would count as the finding."""
    overrides = call("inject_fault", {"kind": "bitflip", "rank": 1, "step": 4}).overrides
    job_id, run_dir = _start(12, "parallel.data_parallel=ddp", *overrides)
    found = call("detect_faults", {"run": str(run_dir), "job_id": job_id, "poll_interval_s": 0.05, "timeout_s": 180,
                                   "fault_kind": "bitflip"})
    assert (found.mechanism, found.rank, found.step, found.isolation) == ("checksum_mismatch", 1, 4, "replica_group")
    call("wait_job", {"job_id": job_id, "timeout_s": 120})
