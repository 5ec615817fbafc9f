"""The in-process supervisor's store against a client that is not the job's (issue 41 class 5).
torch's TCPStore listens on every address and authenticates no one; the job's keys sit under a
secret only its own processes hold (trainer/workers.STORE_SECRET_ENV), and the kernel keeps another
user from reading it out of a worker's environment. Before the secret, the `failed/0/1` written below
set off a recovery: the supervisor killed a healthy rank and admitted a spare."""
from __future__ import annotations

import json
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.trainer.test_inprocess_nodes import start_nodes
from trainops.run_records import read_metrics, read_recoveries
from trainops.tools.calls import call
from trainops.trainer.config import load_config
from trainops.trainer.launch import prepare_run
from trainops.trainer.workers import STORE_SECRET_ENV

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("as_operator")]
TINY = ["model.n_layers=2", "training.seq_len=32", "training.global_batch=4", "training.micro_batch=2",
        "training.steps=80", "resilience.in_process_restart=true", "resilience.collective_timeout_s=10"]


def _started(run_dir: Path, timeout_s: float = 180) -> list[dict]:
    """The workers the supervisor started, once both ranks have taken a step."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = run_dir / "workers.jsonl"
        events = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if events and {r.rank for r in read_metrics(run_dir)} == {0, 1}:
            return events
        time.sleep(0.2)
    raise AssertionError(f"the job's ranks did not step within {timeout_s} s")


def test_a_client_without_the_jobs_secret_can_neither_read_nor_steer_the_supervisor(workspace):
    out = call("submit_job", {"name": "store", "training": {"preset": "tiny", "nproc": 2, "overrides": TINY}})
    job_id, run_dir = out.handle.job_id, Path(out.handle.run_dir)
    events = _started(run_dir)
    port = next(e["store_port"] for e in events if e["event"] == "started")
    outsider = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))
    assert not outsider.check(["ready/0"]) and not outsider.check(["assign/0/1"])  # nothing of the job's to read
    for rank in (0, 1):
        outsider.set(f"failed/0/{rank}", "an outsider says so")  # the supervisor's cue to recover
    outsider.set("shutdown", "1")
    attacked_at = max(r.step for r in read_metrics(run_dir))
    assert call("wait_job", {"job_id": job_id, "timeout_s": 300}).state == "completed"
    assert attacked_at < 80, "the job ended before the outsider wrote: the test proved nothing"
    assert read_recoveries(run_dir) == []
    assert max(r.step for r in read_metrics(run_dir)) == 80


def test_another_user_cannot_read_the_secret_out_of_a_workers_environment(workspace):
    """The secret is as safe as /proc/PID/environ, which the kernel shows only to the process's own user."""
    if subprocess.run(["id", "-u", "nobody"], capture_output=True).returncode != 0:
        pytest.skip("no 'nobody' user to read as")
    out = call("submit_job", {"name": "environ", "training": {"preset": "tiny", "nproc": 2, "overrides": TINY}})
    events = _started(Path(out.handle.run_dir))
    worker = next(e["pid"] for e in events if e["event"] == "started")
    try:
        mine = Path(f"/proc/{worker}/environ").read_bytes()
        assert STORE_SECRET_ENV.encode() + b"=" in mine
        theirs = subprocess.run(["runuser", "-u", "nobody", "--", "/bin/cat", f"/proc/{worker}/environ"],
                                capture_output=True)
        assert theirs.returncode != 0 and STORE_SECRET_ENV.encode() not in theirs.stdout
    finally:
        call("cancel_job", {"job_id": out.handle.job_id})


def test_supervisors_started_by_hand_across_nodes_still_keep_the_store_secret(workspace):
    """Node 0's supervisor and node 1's agent started by hand, without the run's key a trainops launch
    hands them: each derives it from the workspace's own key (trainops/record_keys.py), so the store
    still sits under a secret. Before, a hand launch across nodes had none, and an outsider's
    `failed/0/1` set off a recovery."""
    nodes = TINY + ["resilience.spare_nodes=0", "resilience.warm_spares=0"]
    run_dir = prepare_run(load_config(None, "tiny", nodes), run_id="by-hand")
    leader, agent = launched = start_nodes(run_dir, nnodes=2, with_key=False)
    try:
        wait = time.monotonic() + 180
        while not {r.rank for r in read_metrics(run_dir)} >= {0, 1}:
            assert time.monotonic() < wait and leader.poll() is None, (run_dir / "logs" / "node0.log").read_text()
            time.sleep(0.2)
        host, port = launched.store.rsplit(":", 1)
        outsider = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
        assert not outsider.check(["ready/0"]) and not outsider.check(["assign/0/1"])
        for rank in (0, 1):
            outsider.set(f"failed/0/{rank}", "an outsider says so")
        outsider.set("shutdown", "1")
        attacked_at = max(r.step for r in read_metrics(run_dir))
        assert leader.wait(timeout=300) == 0 and agent.wait(timeout=30) == 0
    finally:
        for node in launched:
            if node.poll() is None:
                node.kill()
    assert attacked_at < 80, "the job ended before the outsider wrote: the test proved nothing"
    assert read_recoveries(run_dir) == [] and max(r.step for r in read_metrics(run_dir)) == 80
