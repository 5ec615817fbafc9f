"""`trainops train`: bad input is one clear error and exit 2; a run prints per-step MFU lines."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainops.cli import app

runner = CliRunner()


def _train(*args: str):
    return runner.invoke(app, ["train", *args], env={"COLUMNS": "400"})


def test_an_unknown_key_is_one_line_naming_it_and_exit_code_2():
    result = _train("--preset", "tiny", "--set", "training.stepz=3")
    assert result.exit_code == 2
    assert "unknown key training.stepz; keys of section 'training' are" in result.output
    assert "Traceback" not in result.output


def test_a_bad_mode_in_json_mode_is_a_json_error():
    result = _train("--preset", "tiny", "--set", "training.precision=fp8", "--json")
    assert result.exit_code == 2
    error = json.loads(result.output)["error"]
    assert "training.precision = 'fp8' is not valid: Input should be 'fp32' or 'bf16'" in error


def test_an_unknown_preset_names_the_choices():
    result = _train("--preset", "gpt5", "--json")
    assert result.exit_code == 2 and "unknown preset 'gpt5'; use one of" in result.output


def test_a_missing_config_file_is_named():
    result = _train("missing.toml", "--json")
    assert result.exit_code == 2 and "config file 'missing.toml' does not exist" in result.output


def test_zero_processes_is_refused():
    result = _train("--preset", "tiny", "--nproc", "0", "--json")
    assert result.exit_code == 2 and "--nproc 0 is not valid" in result.output


def test_an_impossible_layout_is_refused_before_launch_with_the_numbers(workspace):
    result = _train("--preset", "tiny", "--nproc", "3", "--set", "parallel.tp=2", "--json")
    assert result.exit_code == 2 and "world size 3 is not divisible by" in result.output
    assert not (workspace / "runs").exists() or not any((workspace / "runs").iterdir())


def test_a_bad_run_id_is_refused():
    result = _train("--preset", "tiny", "--run-id", "../escape", "--json")
    assert result.exit_code == 2 and "run id '../escape' is not valid" in result.output


def test_dry_run_plans_every_rank_without_launching(workspace):
    result = _train("--preset", "llama3-8b", "--nproc", "4", "--set", "training.micro_batch=2",
                    "--dry-run", "--json")
    assert result.exit_code == 0
    plan = json.loads(result.output)
    assert plan["layout"]["world_size"] == 4 and len(plan["ranks"]) == 4
    assert not (workspace / "runs").exists() or not any((workspace / "runs").iterdir())


@pytest.mark.slow
def test_training_two_processes_prints_per_step_mfu_lines_and_the_run_folder():
    result = _train("--preset", "tiny", "--nproc", "2", "--set", "training.steps=3",
                    "--set", "training.seq_len=32")
    assert result.exit_code == 0, result.output
    step_lines = [line for line in result.output.splitlines() if line.startswith("step ")]
    assert len(step_lines) == 3 and all("mfu " in line and "(measured-gemm)" in line for line in step_lines)
    assert "run folder:" in result.output


@pytest.mark.slow
def test_json_summary_has_run_dir_status_final_loss_and_mfu():
    result = _train("--preset", "tiny", "--nproc", "2", "--set", "training.steps=2",
                    "--set", "training.seq_len=32", "--run-id", "summary", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["status"] == "ok" and summary["run_dir"].endswith("runs/summary")
    assert summary["final_loss"] > 0 and summary["mfu_pct"] > 0 and summary["steps_completed"] == 2
