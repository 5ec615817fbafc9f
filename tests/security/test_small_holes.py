"""The smaller holes: ids with a trailing newline, infinite or unbounded plan inputs, files that
are not UTF-8 or not JSON, and evidence built from run folders trainops never wrote."""
from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.skills.ablation import check_single_variable
from trainops.skills.drill.drill import require_checkpoints
from trainops.skills.request import JobRequest
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.changes.tenancy import tenant_root
from trainops.tools.governance.gate import GateRefused
from trainops.trainer.config import ConfigError, load_config
from trainops.trainer.launch import prepare_run
from trainops.workspace import check_id

runner = CliRunner()
DALY = {"save_s": 60, "restart_s": 600, "mtbf_h": 24}


@pytest.mark.parametrize("value", ["run-1\n", "run-1\r\n", "\nrun-1"])
def test_an_id_with_a_newline_is_refused_by_the_workspace_and_the_trainer(value):
    with pytest.raises(ValueError, match="id .* is not valid"):
        check_id("run", value)
    with pytest.raises(ValueError, match="run id .* is not valid"):
        prepare_run(preset="tiny", run_id=value)


@pytest.mark.parametrize("tool, field, payload", [
    ("plan_checkpoint_interval", "mtbf_h", '{"save_s": 60, "restart_s": 600, "mtbf_h": Infinity}'),
    ("plan_checkpoint_interval", "save_s", '{"save_s": NaN, "restart_s": 600, "mtbf_h": 24}'),
    ("plan_effective_training_time", "checkpoint_interval_min", '{"checkpoint_interval_min": Infinity}'),
    ("plan_effective_training_time", "detection_latency_s", '{"detection_latency_s": Infinity}'),
    ("plan_effective_training_time", "detection_latency_s_by_cause",
     '{"detection_latency_s_by_cause": {"gpu_sdc": NaN}}'),
])
def test_infinite_or_nan_plan_inputs_are_refused_naming_the_field(tool, field, payload):
    with pytest.raises(ToolError, match=rf"invalid input: {field}.*finite"):
        call(tool, json.loads(payload))  # json.loads, like `trainops tool call --input`, reads Infinity and NaN


@pytest.mark.parametrize("inp, field", [
    ({"gpus": 10**12}, "gpus"),
    ({"profile": {"name": "storm", "interruptions": 10**6, "reference_days": 0.01, "reference_gpus": 1,
                  "cause_counts": {"other": 10**6}}}, "failures"),
    ({"restart_s": 10**9}, "restart_s"),
])
def test_plan_sizes_are_bounded_so_a_read_tool_cannot_run_for_hours(inp, field):
    with pytest.raises(ToolError, match=field):
        call("plan_effective_training_time", inp)


def test_a_restart_far_longer_than_the_mtbf_is_a_named_error_not_an_overflow():
    with pytest.raises(ToolError, match=r"restart_s.*mtbf_h"):
        call("plan_checkpoint_interval", {"save_s": 60, "restart_s": 600_000, "mtbf_h": 0.01})
    assert math.isfinite(call("plan_checkpoint_interval", DALY).daly_interval_min)


def test_a_job_config_that_is_not_utf8_is_a_named_error(tmp_path):
    bad = tmp_path / "job.toml"
    bad.write_bytes(b"[model]\npreset = \"tiny\xff\"\n")
    with pytest.raises(ConfigError, match=r"job\.toml.*not UTF-8"):
        load_config(bad)


@pytest.mark.parametrize("content", [b"[training]\nsteps = \"\xff\"\n", b"[training\nsteps = 1\n"])
def test_a_poisoned_run_config_is_a_named_error_in_the_ablation_check(tmp_path, content):
    base, arm = tmp_path / "base", tmp_path / "arm"
    for folder in (base, arm):
        folder.mkdir()
        (folder / "config.toml").write_bytes(content)
    with pytest.raises(ValueError, match=r"base/config\.toml is not (UTF-8|valid TOML)"):
        check_single_variable(str(base), str(arm), "micro_batch=8")


def test_a_drill_config_that_is_not_utf8_is_a_named_error(tmp_path):
    config = tmp_path / "job.toml"
    config.write_bytes(b"[checkpoint]\nenable = \"\xff\"\n")
    with pytest.raises(ValueError, match=r"job\.toml is not UTF-8"):
        require_checkpoints(JobRequest(config=str(config), nproc=2))


def test_a_corrupt_framework_pin_refuses_the_upgrade_with_the_file_named():
    pin = tenant_root("acme") / "framework.json"
    pin.parent.mkdir(parents=True, exist_ok=True)
    pin.write_bytes(b"\xff\xfe{not json")
    with pytest.raises(GateRefused, match=r"invalid_input.*framework\.json"):
        call("upgrade_framework", {"tenant": "acme", "framework": "torch", "from_version": "2.12.0",
                                   "to_version": "2.13.0"})


def test_evidence_build_refuses_a_run_folder_outside_the_workspace(tmp_path):
    outside = tmp_path / "elsewhere" / "run-1"
    outside.mkdir(parents=True)
    (outside / "config.toml").write_text(load_config(preset="tiny").to_toml())
    (outside / "metrics.jsonl").write_text(json.dumps({"step": 1, "rank": 0, "mfu_pct": 99.0}) + "\n")
    result = runner.invoke(app, ["evidence", "build", str(outside), "--json"])
    assert result.exit_code == 2 and "outside the workspace" in json.loads(result.stdout)["error"]


def test_evidence_build_refuses_a_run_folder_trainops_did_not_write(workspace):
    forged = workspace / "runs" / "forged-run"
    forged.mkdir(parents=True)
    (forged / "metrics.jsonl").write_text(json.dumps({"step": 1, "rank": 0, "mfu_pct": 99.0, "step_time_s": 0.1,
                                                      "tokens_per_s": 1e9, "loss": 1.0}) + "\n")
    result = runner.invoke(app, ["evidence", "build", str(forged), "--json"])
    assert result.exit_code == 2
    assert "config.toml" in json.loads(result.stdout)["error"] and "forged-run" in result.stdout
