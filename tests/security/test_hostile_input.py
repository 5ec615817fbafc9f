"""Hostile input (issue 23, attack 10): poisoned metrics and heartbeat records, a named pipe or a
huge line in a run folder, a deeply nested or NUL-carrying --input, a non-finite learning rate and
a broken user config. Each gives one clear error naming the field, never a traceback or a hang,
and a good record beside a poisoned one is still read."""
from __future__ import annotations

import json
import os
import sys

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.schedulers import JobSpec, get_scheduler
from trainops.trainer.config import ConfigError, load_config
from trainops.workspace import jobs_dir, runs_dir

runner = CliRunner()
GOOD = {"step": 1, "rank": 0, "time": 1.0, "loss": 2.5, "step_time_s": 0.1, "tokens_per_s": 10.0, "mfu_pct": 1.0}
POISON = {
    "loss_as_string": '{"step": 2, "rank": 0, "time": 2.0, "loss": "high"}',
    "nested_objects": '{"step": 2, "rank": 0, "time": 2.0, "loss": {"a": {"b": 1}}, "custom": {"y": [1, 2]}}',
    "huge_number": '{"step": 2, "rank": 0, "time": 2.0, "custom": 1' + "0" * 400 + "}",
    "huge_step": '{"step": 1' + "0" * 400 + ', "rank": 0, "time": 2.0, "custom": 1}',
    "nan_and_inf": '{"step": 2, "rank": 0, "time": NaN, "loss": NaN, "step_time_s": Infinity}',
    "negative_rank": '{"step": 2, "rank": -5, "time": 2.0, "loss": 1.0}',
    "wrong_types": '{"step": "two", "rank": [0], "time": "now"}',
    "missing_step": '{"rank": 0, "time": 2.0, "loss": 1.0}',
    "list_not_object": "[1, 2, 3]",
    "1e400": '{"step": 2, "rank": 0, "time": 1e400, "loss": 1e400, "tokens_per_s": 1e400, "mfu_pct": -1e400}',
}
TOOLS = [("summarize_run", {}), ("query_metrics", {"metric": "loss"}), ("query_metrics", {"metric": "custom"}),
         ("query_metrics", {"metric": "heartbeat_age_s"}), ("query_metrics", {"metric": "mfu_pct_avg"}),
         ("query_metrics", {"metric": "loss", "mode": "series"}), ("detect_faults", {"timeout_s": 0.3})]


def _run(name: str, metrics: bytes, beat: bytes | None = None):
    run = runs_dir() / name
    (run / "heartbeat").mkdir(parents=True)
    (run / "metrics.jsonl").write_bytes(metrics)
    (run / "heartbeat" / "rank0.json").write_bytes(beat if beat is not None else b'{"step": 1, "time": 1.0}')
    return run


def _answer_or_named_error(tool: str, inp: dict):
    """The tool answers, or raises one ToolError; anything else (a traceback) fails the test."""
    try:
        out = call(tool, inp)
    except ToolError as exc:
        assert str(exc).strip()
        return None
    json.dumps(out.model_dump(mode="json"))
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(POISON))
def test_a_poisoned_metrics_or_heartbeat_record_is_skipped_and_the_good_one_kept(case):
    line = POISON[case]
    _run("r-" + case.replace("_", "-"), (json.dumps(GOOD) + "\n" + line + "\n").encode(), line.encode())
    for tool, extra in TOOLS:
        _answer_or_named_error(tool, {"run": "r-" + case.replace("_", "-"), **extra})
    summary = call("summarize_run", {"run": "r-" + case.replace("_", "-"), "skip_steps": 0})
    assert summary.steps_measured >= 1 and summary.step_time_median_s == pytest.approx(0.1)  # the good one kept


@pytest.mark.timeout(30)
def test_a_named_pipe_as_metrics_or_heartbeat_does_not_hang_the_readers():
    run = runs_dir() / "r-fifo"
    (run / "heartbeat").mkdir(parents=True)
    os.mkfifo(run / "metrics.jsonl")
    os.mkfifo(run / "heartbeat" / "rank0.json")
    os.mkfifo(run / "status.json")
    with pytest.raises(ToolError, match="no records"):
        call("summarize_run", {"run": "r-fifo"})
    for tool, extra in TOOLS[1:]:
        _answer_or_named_error(tool, {"run": "r-fifo", **extra})


@pytest.mark.timeout(60)
def test_a_line_too_long_to_be_a_record_is_dropped_and_the_lines_around_it_kept():
    later = {**GOOD, "step": 3, "loss": 1.5}
    huge = b'{"step": 2, "pad": "' + b"x" * (24 << 20) + b'"}'
    _run("r-huge", json.dumps(GOOD).encode() + b"\n" + huge + b"\n" + json.dumps(later).encode() + b"\n")
    summary = call("summarize_run", {"run": "r-huge", "skip_steps": 0})
    assert summary.steps_measured == 2 and summary.final_loss == 1.5


def test_deeply_nested_input_json_is_one_clear_error():
    result = runner.invoke(app, ["tool", "call", "plan_checkpoint_interval", "--input", "[" * 100_000 + "]" * 100_000])
    assert result.exit_code == 2, result.output
    assert "--input" in result.output and "nest" in result.output and "Traceback" not in result.output


def test_a_nul_byte_in_a_command_is_refused_naming_the_field():
    payload = json.dumps({"name": "x", "command": ["python", "-c", "print(1)\x00rm -rf /"]})
    result = runner.invoke(app, ["tool", "call", "submit_job", "--input", payload])
    assert result.exit_code == 2, result.output
    assert "command.2" in result.output and "NUL" in result.output


@pytest.mark.parametrize("value", ["inf", "nan", "-inf", "1e400"])
def test_a_non_finite_learning_rate_is_refused(value):
    with pytest.raises(ConfigError, match=r"training\.lr.*finite"):
        load_config(preset="tiny", overrides=[f"training.lr={value}"])
    with pytest.raises(ToolError, match=r"training\.lr.*finite"):
        call("plan_layout", {"preset": "tiny", "nproc": 1, "overrides": [f"training.lr={value}"]})


def test_a_broken_user_config_makes_a_mutate_call_one_clear_error(tmp_path, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text("[governance\nroots = 3\n")
    monkeypatch.setenv("TRAINOPS_CONFIG", str(config))
    result = runner.invoke(app, ["tool", "call", "quarantine_checkpoints", "--input", '{"run": "r1", "from_step": 0}'])
    assert result.exit_code == 2, result.output
    assert str(config) in result.output and "not valid TOML" in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)


@pytest.mark.timeout(30)
def test_a_named_pipe_as_a_jobs_exit_file_or_record_does_not_hang_list_jobs():
    """A job can replace its own exit file with a FIFO, or garble its record: the local scheduler reads
    neither as anything but absent or invalid, and list_jobs answers."""
    sched = get_scheduler("local")
    fifo = sched.submit(JobSpec(name="t", command=[sys.executable, "-c", "import time; time.sleep(30)"]))
    try:
        exit_file = jobs_dir() / f"{fifo.job_id}.exit"
        exit_file.unlink(missing_ok=True)
        os.mkfifo(exit_file)
        assert call("job_status", {"job_id": fifo.job_id}).state == "running"
        assert fifo.job_id in {j.job_id for j in call("list_jobs", {}).jobs}
    finally:
        sched.cancel(fifo.job_id, force=True)
    (jobs_dir() / "garbled.json").write_text("[1, 2")
    with pytest.raises(ToolError, match="garbled.json is not a JSON object trainops wrote"):
        call("job_status", {"job_id": "garbled"})
    assert "garbled" not in {j.job_id for j in call("list_jobs", {}).jobs}
