"""Injected faults seen from outside a 2-process torchrun job, the way a drill sees them:
the crashed rank's exit code, a hang as a heartbeat that stops while the processes live,
a bit-flip as a loss that leaves the clean run's trajectory."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainops.run_records import read_metrics
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.jobs.follow import launch_run, run_local
from trainops.tools.schedulers.processes import job_of_run, stop_processes
from trainops.trainer.config import load_config
from trainops.trainer.faults import CRASH_EXIT_CODE
from trainops.trainer.launch import prepare_run, torchrun_argv, trainer_program

pytestmark = pytest.mark.slow

BASE = ["model.n_layers=2", "training.seq_len=32", "training.global_batch=8", "training.micro_batch=4"]
OPERATOR = CallContext(actor="operator")  # the test launches as an operator at a terminal would


def kill_tree(job: subprocess.Popen) -> None:
    """SIGKILL torchrun and every rank below it, as the local scheduler stops a job."""
    try:
        root = psutil.Process(job.pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:  # torchrun already ended and was reaped
        tree = []
    stop_processes(tree, job.pid, grace_s=0)
    job.wait()


def faults_jsonl(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "faults.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_crashed_rank_ends_the_job_with_its_exit_code(tmp_path):
    cfg = load_config(None, "tiny", BASE + ["training.steps=6", "faults.crash_step=3", "faults.crash_rank=1"])
    result = run_local(cfg, 2, run_id="crash", ctx=OPERATOR, timeout_s=300)
    assert result.status == "failed" and result.steps_completed == 2
    scheduler, job_id = job_of_run(Path(result.run_dir))
    launcher_log = call("job_logs", {"job_id": job_id, "scheduler": scheduler, "tail": 0}, OPERATOR).text
    assert re.search(rf"exitcode\s*:\s*{CRASH_EXIT_CODE}\b", launcher_log)
    assert [(f["kind"], f["step"], f["rank"]) for f in faults_jsonl(result.run_dir)] == [("crash", 3, 1)]


def test_a_bitflip_sends_the_loss_off_the_clean_trajectory(tmp_path):
    clean = run_local(load_config(None, "tiny", BASE + ["training.steps=4"]), 2, run_id="clean",
                      ctx=OPERATOR, timeout_s=300)
    flipped = run_local(load_config(None, "tiny", BASE + ["training.steps=4", "faults.bitflip_step=2",
                                                          "faults.bitflip_rank=1"]),
                        2, run_id="flipped", ctx=OPERATOR, timeout_s=300)
    loss = {name: {r.step: r.loss for r in read_metrics(res.run_dir) if r.rank == 0}
            for name, res in (("clean", clean), ("flipped", flipped))}
    assert [loss["flipped"][s] == loss["clean"][s] for s in (1, 2)] == [True, True]
    assert loss["flipped"][3] != loss["clean"][3]
    (record,) = faults_jsonl(flipped.run_dir)
    assert record["kind"] == "bitflip" and record["rank"] == 1 and record["step"] == 2


def test_a_hung_rank_is_seen_as_a_heartbeat_that_stops_while_the_processes_live(tmp_path):
    cfg = load_config(None, "tiny", BASE + ["training.steps=50", "faults.hang_step=3", "faults.hang_rank=1"])
    run_dir = prepare_run(cfg, run_id="hang")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(torchrun_argv(sys.executable, 2, trainer_program(run_dir)), env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        while not faults_jsonl(run_dir) and time.time() < deadline and job.poll() is None:
            time.sleep(0.2)
        (record,) = faults_jsonl(run_dir)
        time.sleep(3.0)
        heartbeat = json.loads((run_dir / "heartbeat" / "rank1.json").read_text())
        assert job.poll() is None
        assert heartbeat["step"] == 2 and time.time() - heartbeat["time"] >= 3.0
        assert heartbeat["time"] <= record["time"]
    finally:
        kill_tree(job)


def test_a_nan_run_relaunched_resumes_from_its_checkpoint_and_completes(tmp_path):
    """The relaunch reads the same config (faults.nan_step=4): the NaN fired once, so it must not
    fire again, or every requeue of a run would fail the same way."""
    cfg = load_config(None, "tiny", BASE + ["training.steps=6", "faults.nan_step=4", "checkpoint.enable=true",
                                            "checkpoint.interval=2", "checkpoint.mode=sync"])
    failed = run_local(cfg, 2, run_id="nan-once", ctx=OPERATOR, timeout_s=300)
    assert failed.status == "failed" and failed.steps_completed == 4  # step 4 is logged with its NaN
    resumed = launch_run(failed.run_dir, 2, ctx=OPERATOR, timeout_s=300)
    assert resumed.status == "ok" and resumed.steps_completed == 6
    rank0 = [r for r in read_metrics(resumed.run_dir) if r.rank == 0]
    assert [r.step for r in rank0] == [1, 2, 3, 4, 3, 4, 5, 6]  # restarted after step 2's checkpoint
    assert all(math.isfinite(r.loss) for r in rank0 if r.step > 4)
    assert [(f["kind"], f["step"]) for f in faults_jsonl(resumed.run_dir)] == [("nan", 4), ("nan", 4)]  # once per rank


def test_a_rank_its_launcher_terminates_says_so_and_the_killed_rank_is_named(workspace):
    """torchrun SIGTERMs the survivors as soon as a rank dies. A survivor caught computing died
    without a word, as silent as the killed rank, and detection could name it instead (a CI
    failure: rank 0 named for a SIGKILLed rank 1). The terminated rank now notes its exit."""
    cfg = load_config(None, "tiny", BASE + ["training.steps=5000"])
    run_dir = prepare_run(cfg, run_id="terminated")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    job = subprocess.Popen(torchrun_argv(sys.executable, 2, trainer_program(run_dir)), env=env, start_new_session=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    beats = run_dir / "heartbeat"
    try:
        deadline = time.time() + 240
        while len(list(beats.glob("rank*.json"))) < 2 and time.time() < deadline and job.poll() is None:
            time.sleep(0.1)
        pids = [json.loads((beats / f"rank{r}.json").read_text())["pid"] for r in (0, 1)]
        os.kill(pids[1], 9)
        os.kill(pids[0], 15)
        job.wait(timeout=120)
        assert "exit" in json.loads((beats / "rank0.json").read_text())
        assert "exit" not in json.loads((beats / "rank1.json").read_text())
        found = call("detect_faults", {"run": str(run_dir), "poll_interval_s": 0.05, "timeout_s": 10})
        assert (found.mechanism, found.rank) == ("process_exit", 1)
    finally:
        kill_tree(job)
