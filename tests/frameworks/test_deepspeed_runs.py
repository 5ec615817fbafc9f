"""The DeepSpeed adapter end to end against real DeepSpeed on the CPU (ZeRO on 2 gloo processes
under torchrun, through the local scheduler): a baseline, a single-knob ablation (ZeRO stage 1
vs 2) and a crash drill that recovers from DeepSpeed's own checkpoint."""
from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path

import pytest

from trainops.run_folder import this_launch
from trainops.skills.ablation import run_arm
from trainops.skills.baseline import run_once, summarize
from trainops.skills.drill.drill import drill
from trainops.skills.request import JobRequest
from trainops.tools.calls import call
from trainops.tools.context import operator_session
from trainops.tools.frameworks import get_adapter

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("as_operator")]

STEPS = ["training.steps=6", "training.seq_len=32"]


def _request(*extra: str) -> JobRequest:
    return JobRequest(framework="deepspeed", preset="tiny", nproc=2, overrides=[*STEPS, *extra], timeout_s=300,
                      framework_version="DeepSpeed (test)")


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """One baseline run shared by the module (each DeepSpeed launch costs ~30 s here)."""
    with pytest.MonkeyPatch.context() as patch, operator_session():  # module fixtures run before as_operator
        patch.setenv("TRAINOPS_HOME", str(tmp_path_factory.mktemp("ds-home")))
        yield run_once(_request(), "ds-baseline")


def test_baseline_trains_on_two_ranks_and_reports_trainops_metrics(baseline):
    result = baseline
    summary = result.summary
    assert summary.ranks == 2 and summary.steps_measured == 4
    assert math.isfinite(summary.final_loss) and summary.mfu_pct_median > 0
    assert summary.peak_source == "measured-gemm"
    status = json.loads((Path(result.run_dir) / "status.json").read_text())
    assert status["status"] == "ok" and status["steps_completed"] == 6


def test_a_cpu_job_never_builds_deepspeeds_inference_only_kernel(baseline):
    """DeepSpeed's CPU backend compiles its shared-memory all-reduce (deepspeed_shm_comm: ~100 s of g++
    the first time on a machine, a load per rank after) though only inference uses it."""
    home = Path(baseline.run_dir).parent.parent
    job_logs = "".join(log.read_text(errors="replace") for log in (home / "jobs").glob("ds-baseline-*.log"))
    assert "world=2" in (Path(baseline.run_dir) / "logs" / "rank0.log").read_text()
    assert job_logs and "deepspeed_shm_comm" not in job_logs


def test_baseline_summary_names_the_deepspeed_layout(baseline):
    assert summarize(_request(), [baseline]).parallel_layout.startswith("world=2 deepspeed data-parallel ZeRO-1 dp=2")


def test_baseline_log_lines_parse_back_to_its_metrics(baseline):
    result = baseline
    run = Path(result.run_dir)
    adapter = get_adapter("deepspeed")
    parsed = [r for r in map(adapter.parse_log_line, (run / "logs" / "rank0.log").read_text().splitlines()) if r]
    recorded = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rank0 = {r["step"]: r for r in recorded if r["rank"] == 0}
    assert [p.step for p in parsed] == list(range(1, 7))
    assert all(p.loss == pytest.approx(rank0[p.step]["loss"], abs=1e-4) for p in parsed)


@pytest.fixture(scope="module")
def zero2_arm(baseline):
    """The single-knob arm ZeRO stage 1 -> 2 against the shared baseline."""
    with operator_session():
        return run_arm(_request(), "zero_stage=2", {2: [baseline]}, repeats=1)


def test_zero_stage_ablation_changes_one_setting_and_runs_stage_2(zero2_arm):
    rows, evidence = zero2_arm
    assert [(r.knob, r.baseline_value, r.value) for r in rows] == [("zero_stage", "1", "2")]
    arm_run = Path(rows[0].source_run)
    assert json.loads((arm_run / "ds_config.json").read_text())["zero_optimization"]["stage"] == 2
    assert "zero_stage=2" in this_launch((arm_run / "logs" / "rank0.log").read_text()).splitlines()[0]
    assert evidence[0].command.startswith("trainops baseline --framework deepspeed")


def test_zero_stage_changes_where_state_lives_not_the_loss(baseline, zero2_arm, monkeypatch):
    monkeypatch.setenv("TRAINOPS_HOME", str(Path(baseline.run_dir).parents[1]))  # the module's shared workspace
    arm = call("summarize_run", {"run": zero2_arm[0][0].source_run})
    assert arm.final_loss == pytest.approx(baseline.summary.final_loss, abs=1e-4)


def test_crash_drill_recovers_from_the_deepspeed_checkpoint():
    req = _request("checkpoint.enable=true", "checkpoint.interval=2", "checkpoint.keep=20").with_overrides(
        ["training.steps=40"])
    result, _ = drill(req, "crash", inject_step=4)
    assert result.detector == "process_exit" and result.detection_latency_s < 10
    assert result.checkpoint_used.rsplit("/", 1)[-1].startswith("step-")
    assert result.async_checkpoint_intact  # the restored checkpoint verifies against its COMMIT.json
    journal = [json.loads(x) for x in (Path(result.run_dir) / "checkpoints.jsonl").read_text().splitlines()]
    assert any(e["event"] == "load" for e in journal)
    config = tomllib.loads((Path(result.run_dir) / "config.toml").read_text())
    assert config["framework"] == "deepspeed"
    status = json.loads((Path(result.run_dir) / "status.json").read_text())
    assert status["status"] == "ok" and status["steps_completed"] == 40


def test_checkpoint_corruption_drill_falls_back_past_the_corrupt_checkpoint_and_rewrites_it():
    # saves 5 steps apart, so no newer save lands between the corruption and the kill
    req = _request("checkpoint.enable=true", "checkpoint.interval=5", "checkpoint.keep=50").with_overrides(
        ["training.steps=40", "training.seq_len=64"])
    result, _ = drill(req, "checkpoint-corruption", inject_step=12)  # saves at 5 and 10 are committed
    journal = [json.loads(x) for x in (Path(result.run_dir) / "checkpoints.jsonl").read_text().splitlines()]
    skipped = {e["step"] for e in journal if e["event"] == "fallback"}
    loaded = next(e for e in journal if e["event"] == "load")
    assert skipped and loaded["step"] < min(skipped), journal
    for step in skipped:  # the restarted run saved that step again, and the new copy verifies
        assert call("verify_checkpoint", {"path": f"{result.run_dir}/checkpoints/step-{step:08d}"}).complete
