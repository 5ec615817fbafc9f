"""The trainer through a real Slurm (munged + slurmctld + slurmd on this host) and a real
Prometheus: completion, metrics, a killed rank, drain/resume, requeue from a checkpoint, and
the errors a dead controller or an unknown job id give."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port, wait_for
from trainops.run_records import read_heartbeats
from trainops.skills.drill.drill import drill
from trainops.skills.request import JobRequest
from trainops.tools.base import ToolError
from trainops.tools.calls import call

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.usefixtures("as_operator")]

TINY = ["training.seq_len=64", "training.global_batch=4", "training.micro_batch=2"]


def _submit_training(steps: int, *extra: str):
    out = call("submit_job", {"scheduler": "slurm", "name": "tiny",
                              "training": {"preset": "tiny", "nproc": 2,
                                           "overrides": [f"training.steps={steps}", *TINY, *extra]}})
    return out.handle.job_id, Path(out.handle.run_dir)


def test_a_two_process_trainer_job_completes_and_prometheus_scrapes_its_metrics(slurm, prometheus):
    # long enough (~30 s on an idle 2-core host) for file discovery and several 1 s scrapes
    job_id, run_dir = _submit_training(600, f"metrics.prometheus_port_base={free_port()}")
    prometheus.scrape_run(run_dir, ranks=2)
    live = {}

    def scraped() -> bool:
        for metric in ("mfu_pct_avg", "tokens_per_s_sum", "step_time_spread_s", "heartbeat_age_s"):
            live[metric] = call("query_metrics", {"run": run_dir.name, "metric": metric, "monitor": "prometheus",
                                                  "url": prometheus.url}).instant
        return all(live.values()) and len(live["heartbeat_age_s"]) == 2  # both targets scraped

    wait_for(scraped, 120, "the run's aggregates in Prometheus", poll_s=0.2)
    assert live["mfu_pct_avg"][0].value > 0 and live["tokens_per_s_sum"][0].value > 0
    assert sorted(s.rank for s in live["heartbeat_age_s"]) == [0, 1] and all(s.value < 30
                                                                             for s in live["heartbeat_age_s"])
    status = call("wait_job", {"job_id": job_id, "scheduler": "slurm", "timeout_s": 300})
    assert (status.state, status.exit_code) == ("completed", 0), call("job_logs", {"job_id": job_id,
                                                                                  "scheduler": "slurm"}).text
    assert json.loads((run_dir / "status.json").read_text())["steps_completed"] == 600
    series = call("query_metrics", {"run": run_dir.name, "metric": "loss", "mode": "series", "window_s": 600,
                                    "monitor": "prometheus", "url": prometheus.url}).series
    assert sorted(s.rank for s in series) == [0, 1]
    assert all(len(s.samples) >= 2 for s in series)
    embedded_final = call("summarize_run", {"run": str(run_dir)}).final_loss
    assert series[0].samples[-1].value == pytest.approx(embedded_final, rel=0.5)


def test_a_killed_rank_is_detected_with_its_latency(slurm):
    job_id, run_dir = _submit_training(2000)
    try:
        wait_for(lambda: len(read_heartbeats(run_dir)) == 2, 180, "both ranks' heartbeats", poll_s=0.2)
        injected = call("inject_fault", {"kind": "kill_rank", "run": str(run_dir), "rank": 1})
        found = call("detect_faults", {"run": str(run_dir), "job_id": job_id, "scheduler": "slurm",
                                       "poll_interval_s": 0.05, "timeout_s": 60})
        assert (found.mechanism, found.rank, found.isolation) == ("process_exit", 1, "node")
        assert found.injected_at == pytest.approx(injected.injected_at)
        assert 0 <= found.detection_latency_s < 5
        assert call("wait_job", {"job_id": job_id, "scheduler": "slurm", "timeout_s": 120}).state == "failed"
    finally:
        call("cancel_job", {"job_id": job_id, "scheduler": "slurm"})


@pytest.mark.parametrize("force", [False, True])
def test_cancel_gives_the_batch_a_grace_period_unless_forced(slurm, tmp_path, force):
    code = (f"import pathlib, signal, sys, time; d = pathlib.Path({str(tmp_path)!r}); "
            "signal.signal(signal.SIGTERM, lambda *_: (d.joinpath('terminated').write_text('x'), sys.exit(0))); "
            "d.joinpath('ready').write_text('x'); time.sleep(120)")
    job_id = call("submit_job", {"scheduler": "slurm",
                                 "spec": {"name": "graceful", "command": [sys.executable, "-c", code]}}).handle.job_id
    wait_for(lambda: (tmp_path / "ready").exists(), 60, "the job to start", poll_s=0.2)
    status = call("cancel_job", {"job_id": job_id, "scheduler": "slurm", "force": force})
    # forced, the batch may die of the SIGKILL before slurmctld files the cancel: Slurm records FAILED
    assert status.state == "cancelled" or (force and status.state == "failed")
    assert (tmp_path / "terminated").exists() is not force


def test_a_crash_drill_recovers_through_slurm(slurm):
    job = ["training.steps=14", *TINY, "checkpoint.enable=true", "checkpoint.interval=2", "checkpoint.mode=async"]
    result, row = drill(JobRequest(scheduler="slurm", overrides=job, timeout_s=300), "crash")
    assert result.detector.startswith("process_exit") and result.isolation_granularity == "node"
    assert result.async_checkpoint_intact and result.recovery_time_s > 0 and "crash" in row.value
    assert call("list_nodes", {"scheduler": "slurm"}).nodes[0].state == "idle"  # one node: reused, not drained


def test_a_drained_node_holds_new_jobs_until_it_is_resumed(slurm):
    node = slurm.host
    assert call("drain_node", {"scheduler": "slurm", "node": node, "reason": "drill"}).state == "drained"
    try:
        spec = {"name": "after-drain", "command": [sys.executable, "-c", "print('ran')"]}
        job_id = call("submit_job", {"scheduler": "slurm", "spec": spec}).handle.job_id
        time.sleep(2)
        assert call("job_status", {"job_id": job_id, "scheduler": "slurm"}).state == "pending"
    finally:
        assert call("resume_node", {"scheduler": "slurm", "node": node}).state in ("idle", "allocated", "mixed")
    assert call("wait_job", {"job_id": job_id, "scheduler": "slurm", "timeout_s": 60}).state == "completed"
    assert "ran" in call("job_logs", {"job_id": job_id, "scheduler": "slurm"}).text


def test_a_requeued_job_resumes_from_its_newest_checkpoint(slurm):
    job_id, run_dir = _submit_training(60, "checkpoint.enable=true", "checkpoint.interval=5")
    journal = run_dir / "checkpoints.jsonl"

    def saved_steps() -> list[int]:
        if not journal.exists():
            return []
        return [e["step"] for e in map(json.loads, journal.read_text().splitlines()) if e.get("event") == "save"]

    wait_for(lambda: any(s >= 5 for s in saved_steps()), 240, "a first checkpoint", poll_s=0.2)
    call("requeue_job", {"job_id": job_id, "scheduler": "slurm"})
    status = call("wait_job", {"job_id": job_id, "scheduler": "slurm", "timeout_s": 400})
    assert status.state == "completed", call("job_logs", {"job_id": job_id, "scheduler": "slurm"}).text
    loads = [e for e in map(json.loads, journal.read_text().splitlines()) if e.get("event") == "load"]
    assert loads and loads[-1]["step"] >= 5
    assert json.loads((run_dir / "status.json").read_text())["steps_completed"] == 60


def test_an_unknown_job_id_names_slurm_and_the_id(slurm):
    with pytest.raises(ToolError, match=r"slurm scheduler: unknown job id '987654'"):
        call("job_status", {"job_id": "987654", "scheduler": "slurm"})


def test_a_dead_controller_is_a_clear_error_naming_its_address(slurm):
    slurm.stop_controller()
    try:
        with pytest.raises(ToolError,
                           match=r"slurm scheduler: (`sinfo --json` failed|pyslurm could not list nodes): .*is "
                                 r"slurmctld running at .*check with `scontrol ping`"):
            call("list_nodes", {"scheduler": "slurm"})
    finally:
        slurm.start_controller()
        slurm.wait_idle()
