"""A loss or grad-norm divergence without NaN names a silent-data-corruption suspect (issue 42 item 5,
K-FM-5) and sets off the same response as a checksum mismatch; ordinary noise does not. The job here
is a stand-in for the trainer: a few lines writing metrics.jsonl and heartbeats the way
trainer/metrics.py does (one O_APPEND write per record), with no replica checksums (a sharded
layout writes none), run through the local scheduler and watched with `watch_job`."""
from __future__ import annotations

import json
import math
import random
import socket
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.governance import queue
from trainops.trainer.config import load_config

pytestmark = pytest.mark.usefixtures("as_operator")
OPERATOR = CallContext(actor="operator")
HOST = socket.gethostname()

JOB = r"""
import json, os, socket, sys, time
run_dir, rows = sys.argv[1], json.load(open(sys.argv[2]))
os.makedirs(f"{run_dir}/heartbeat", exist_ok=True)
for step, rank, loss, grad_norm in rows:
    rec = {"step": step, "rank": rank, "loss": loss, "grad_norm": grad_norm, "step_time_s": 0.1,
           "tokens_per_s": 1000.0, "flops_per_token": 1e6, "tflops": 0.01, "mfu_pct": 2.0, "peak_mem_gib": 0.1,
           "time": time.time(), "data_wait_s": 0.01, "peak_source": "measured GEMM"}
    fd = os.open(f"{run_dir}/metrics.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, (json.dumps(rec) + "\n").encode())
    os.close(fd)
    tmp = f"{run_dir}/heartbeat/rank{rank}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"step": step, "time": time.time(), "pid": os.getpid(), "host": socket.gethostname()}, fh)
    os.replace(tmp, f"{run_dir}/heartbeat/rank{rank}.json")
"""


def training(steps: int = 40, *, bend=None) -> list[tuple[int, int, float, float]]:
    """Two ranks' (step, rank, loss, grad_norm): a loss falling to ~2.5 with a little noise, a grad norm
    near 1 that swings up to 6x in the first ten steps (warm-up); `bend(step, rank, loss, grad)` changes
    a row."""
    rng, rows = random.Random(7), []
    for step in range(1, steps + 1):
        for rank in (0, 1):
            loss = 2.5 + 8.0 * math.exp(-step / 6) + rng.uniform(-0.05, 0.05)
            grad = (6.0 if step <= 10 and step % 3 == 0 else 1.0) * rng.uniform(0.85, 1.15)
            rows.append(bend(step, rank, loss, grad) if bend else (step, rank, loss, grad))
    return rows


def run_job(workspace: Path, name: str, rows, config: bool = False) -> tuple[str, Path]:
    run_dir = workspace / "runs" / name
    run_dir.mkdir(parents=True)
    if config:  # what `trainops evidence build` asks of a run trainops launched
        (run_dir / "config.toml").write_text(load_config(preset="tiny").to_toml())
    series = workspace / f"{name}.json"
    series.write_text(json.dumps(rows))
    spec = {"name": name, "command": [sys.executable, "-c", JOB, str(run_dir), str(series)], "run_dir": str(run_dir)}
    job = call("submit_job", {"spec": spec}, OPERATOR).handle.job_id
    return job, run_dir


def watch(job: str) -> dict:
    inp = {"job_id": job, "poll_interval_s": 0.1, "timeout_s": 60}
    result = CliRunner().invoke(app, ["tool", "call", "watch_job", "--input", json.dumps(inp), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def diverges_on_rank_1_from_step_30(step, rank, loss, grad):
    return (step, rank, loss * 4, grad * 20) if rank == 1 and step >= 30 else (step, rank, loss, grad)


def noisy(step, rank, loss, grad):
    """Spikes that recover: one step of 8x grad norm, two of 10x, two of 2x loss."""
    if rank == 1 and step in (25, 33, 34):
        return step, rank, loss, grad * (8 if step == 25 else 10)
    return (step, rank, loss * 2, grad) if rank == 0 and step in (30, 31) else (step, rank, loss, grad)


def test_a_divergence_without_nan_names_the_suspect_and_noise_that_recovers_does_not(workspace):
    job, _run = run_job(workspace, "diverged", training(bend=diverges_on_rank_1_from_step_30))
    out = watch(job)
    assert [e["rule_id"] for e in out["fired"]] == ["R-ESC-3"]
    suspect = out["suspect"]
    assert (suspect["rank"], suspect["step"], suspect["node"]) == (1, 30, HOST)
    assert suspect["evidence"].startswith("divergence: loss diverged without NaN on rank 1 for 3 steps from step 30")
    assert out["signals"]["sdc_suspected"] and "rank 1 on node" in out["fired"][0]["detail"]

    job, _run = run_job(workspace, "noisy", training(bend=noisy))
    out = watch(job)
    assert (out["ended"], out["state"], out["fired"], out["suspect"]) == (True, "completed", [], None)


def test_numbers_a_job_writes_are_bounded_a_huge_finite_value_is_judged_and_a_zero_window_is_not(workspace):
    def untrusted(step, rank, loss, grad):
        if rank == 0:  # no scale: a window of zeros and negative losses is never judged against
            return step, rank, -1.0, 0.0 if step < 30 else 5.0
        return (step, rank, loss, 1.0e308) if step >= 30 else (step, rank, loss, grad)

    job, run_dir = run_job(workspace, "untrusted", training(bend=untrusted))
    out = watch(job)
    assert (out["suspect"]["rank"], out["suspect"]["step"]) == (1, 30)
    assert "grad_norm diverged without NaN" in out["suspect"]["evidence"]
    assert "1e+308 is " in out["suspect"]["evidence"] and len(out["suspect"]["evidence"]) < 300

    # detect_faults reads the same jump test: a window of zero grad norms has no scale (it divided by it)
    result = CliRunner().invoke(app, ["tool", "call", "detect_faults", "--input",
                                      json.dumps({"run": str(run_dir), "timeout_s": 0.5}), "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert (found["mechanism"], found["rank"], found["step"]) == ("loss_anomaly", 1, 30)


@pytest.mark.slow
def test_trainops_watch_sends_a_divergence_to_the_sdc_response_and_the_pack_carries_the_case(workspace):
    job, run_dir = run_job(workspace, "diverged", training(bend=diverges_on_rank_1_from_step_30), config=True)
    watched = CliRunner().invoke(app, ["watch", job, "--interval", "0.2", "--timeout", "60", "--json"])
    assert watched.exit_code == 3, watched.output
    body = json.loads(watched.stdout)
    (line,) = body["handed_to_human"]
    assert line.startswith("R-ESC-3 fleet_and_colocated_sdc_tests") and "divergence: loss diverged" in line
    assert "fleet test job" in line and "pending approval" in line  # the known-answer check ran on the node
    case = json.loads((run_dir / "sdc-case.json").read_text())
    assert (case["suspect"]["rank"], case["suspect"]["step"]) == (1, 30) and case["fleet"]["failed_nodes"] == []
    assert queue.get_pending(case["pending_id"]).tool == "acknowledge_escalation"

    built = CliRunner().invoke(app, ["evidence", "build", str(run_dir), "--json"])
    assert built.exit_code == 0, built.output
    pack = json.loads((Path(json.loads(built.stdout)["pack_dir"]) / "evidence.json").read_text())
    assert line in pack["awaiting_human"]  # the same case, the same pending approval: not queued twice
    assert [p.id for p in queue.pending_calls()] == [case["pending_id"]]
