"""The baseline's four-way bottleneck split (issue 24, item 4): compute, EXPOSED communication, data
loading and scheduling fragmentation, each a share of wall time with its method; scheduling from
the scheduler's own times; a per-rank step-time heatmap and a layout view in the pack."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.skills.bottleneck import exposed_comm
from trainops.skills.evidence.model import BaselineSummary
from trainops.skills.evidence.pack import assemble, write
from trainops.tools.schedulers import slurm_transport

MAIN, WORKER = 1, 2


def _event(name: str, ts: float, dur: float, tid: int = MAIN, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "cat": cat}


def _step(ts: float = 0.0, dur: float = 100.0) -> dict:
    return _event("train_step#3", ts, dur, cat="user_annotation")


def test_a_collective_fully_overlapped_by_gpu_compute_counts_zero_exposed():
    reading = exposed_comm([_step(), _event("ncclDevKernel_AllReduce", 20, 30, tid=7, cat="kernel"),
                            _event("ampere_sgemm", 10, 60, tid=8, cat="kernel")])
    assert (reading.comm_us, reading.exposed_us, reading.step_us) == (30.0, 0.0, 100.0)


def test_a_collective_partly_overlapped_is_exposed_only_where_nothing_computes():
    reading = exposed_comm([_step(), _event("ncclDevKernel_AllReduce", 40, 40, tid=7, cat="kernel"),
                            _event("ampere_sgemm", 10, 50, tid=8, cat="kernel")])
    assert (reading.comm_us, reading.exposed_us) == (40.0, 20.0)  # 60..80 has no kernel beside it
    assert reading.exposed_share_pct == 20.0


def test_a_gloo_collective_on_its_thread_is_hidden_by_cpu_ops_on_the_step_thread():
    reading = exposed_comm([_step(), _event("gloo:all_reduce", 10, 30, tid=WORKER, cat="user_annotation"),
                            _event("aten::mm", 0, 50)])
    assert (reading.comm_us, reading.exposed_us) == (30.0, 0.0)


def test_a_collective_the_step_thread_waits_for_is_all_exposed():
    reading = exposed_comm([_step(), _event("gloo:all_reduce", 60, 30, tid=WORKER, cat="user_annotation"),
                            _event("aten::mm", 0, 50)])
    assert reading.exposed_us == 30.0


def test_cpu_ops_inside_a_collective_range_do_not_hide_it():
    """The shared-memory all-gather copies on the step's own thread: that copy is the collective."""
    reading = exposed_comm([_step(), _event("FSDP::all_gather", 10, 20, cat="user_annotation"),
                            _event("aten::copy_", 12, 15), _event("aten::mm", 40, 50)])
    assert (reading.comm_us, reading.exposed_us) == (20.0, 20.0)


def test_collectives_outside_the_steps_do_not_count_and_no_step_gives_no_reading():
    assert exposed_comm([_step(), _event("c10d::allreduce_", 150, 20)]).comm_us == 0.0
    assert exposed_comm([_event("gloo:all_reduce", 0, 10, tid=WORKER)]) is None


@pytest.mark.slow
def test_a_two_process_baseline_splits_its_wall_time_four_ways_and_packs_both_views(factories, workspace):
    args = ["baseline", "--repeats", "1", "--nproc", "2", "--json", "--set", "training.steps=6",
            "--set", "training.seq_len=64", "--set", "training.global_batch=8", "--set", "training.micro_batch=4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = BaselineSummary.model_validate(json.loads(result.output))
    split = summary.bottleneck
    shares = {"compute": split.compute, "communication": split.communication, "data": split.data_loading,
              "scheduling": split.scheduling, "start-up": split.startup}
    for name, share in shares.items():
        assert share.share_pct is not None and 0 <= share.share_pct <= 100, (name, share)
        assert share.method and not share.method.startswith("not measured"), (name, share.method)
    assert split.communication.share_pct > 0  # two FSDP ranks wait for their gathers and reductions
    assert split.scheduling.share_pct >= 0 and split.startup.share_pct > 0 and split.idle_allocated_s > 0
    assert "local scheduler job times (job_status)" in split.scheduling.method
    assert split.scheduling.seconds == pytest.approx(split.queue_wait_s)  # fragmentation: the scheduler's wait only
    assert split.startup.seconds == pytest.approx(split.idle_allocated_s)
    record = json.loads(next((workspace / "jobs").glob("baseline-1-*.json")).read_text())  # the scheduler's own
    assert split.queue_wait_s == pytest.approx(record["started_at"] - record["submitted_at"])
    total = sum(s.share_pct for s in shares.values()) + split.remainder.share_pct
    assert total == pytest.approx(100.0, abs=0.5)
    assert split.layout == {"dp": 2, "tp": 1, "pp": 1}
    assert [(r.rank, r.dp) for r in split.ranks] == [(0, 0), (1, 1)]
    assert all(r.exposed_comm_share_pct is not None for r in split.ranks)

    pack = assemble("bottleneck-1", factories.environment(), summary, [], [], [])
    folder = write(pack)
    plots = {p.name for p in (folder / "plots").iterdir()}
    assert {"rank_step_heatmap.png", "layout_view.png"} <= plots
    assert (folder / "plots" / "layout_view.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "scheduling fragmentation" in (folder / "report.md").read_text()


def test_slurm_reports_its_submit_time_so_the_queue_wait_is_the_schedulers(monkeypatch):
    """scontrol's SubmitTime -> StartTime is the queue wait Slurm itself measured."""
    shown = ("JobId=7 JobName=baseline-1 JobState=COMPLETED Reason=None ExitCode=0:0 NodeList=n1 "
             "SubmitTime=2026-12-02T01:00:00 StartTime=2026-12-02T01:00:42 EndTime=2026-12-02T01:03:00")
    monkeypatch.setattr(slurm_transport, "run_cli", lambda args, check=True: subprocess.CompletedProcess(
        args, 0, shown, ""))
    job = slurm_transport.CliTransport().job("7")
    assert job.submitted_at == time.mktime(time.strptime("2026-12-02T01:00:00", "%Y-%m-%dT%H:%M:%S"))
    assert job.started_at - job.submitted_at == 42.0
