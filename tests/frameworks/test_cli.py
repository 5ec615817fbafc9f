"""`--framework` at the command line: the framework's knobs, and refusals before anything launches
(exit 2, one JSON line naming the flag and the fix, and no run folder created)."""
from __future__ import annotations

import json
import shlex

from typer.testing import CliRunner

from trainops.cli import app
from trainops.skills import baseline as skill_baseline
from trainops.skills.baseline import command_line
from trainops.skills.request import JobRequest

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args))


def _refused(result) -> str:
    assert result.exit_code == 2, result.stdout
    return json.loads(result.stdout)["error"]


def test_unknown_framework_is_refused_for_every_sop_step():
    for command in ("baseline", "ablate", "drill", "sop"):
        error = _refused(_run(command, "--framework", "jax", "--json"))
        assert error == "--framework: unknown framework 'jax'; use one of trainops, deepspeed, torchtitan, megatron"


def test_ablate_list_shows_the_frameworks_own_flags_in_plan_order():
    result = _run("ablate", "--framework", "megatron", "--list", "--json")
    assert result.exit_code == 0
    knobs = json.loads(result.stdout)
    assert knobs[0]["name"] == "tp_comm_overlap" and knobs[0]["overrides"] == ["megatron.tp_comm_overlap"]
    assert knobs[0]["expected_effect"].startswith("--tp-comm-overlap: ")


def test_a_knob_the_framework_lacks_is_refused(workspace):
    error = _refused(_run("ablate", "--framework", "deepspeed", "--knob", "pp_schedule=1F1B", "--json"))
    assert error.startswith("knob: unknown knob 'pp_schedule' for deepspeed; known knobs: overlap_comm")
    assert not (workspace / "runs").exists()


def test_a_forbidden_flag_combination_is_refused_before_launch(workspace):
    error = _refused(_run("ablate", "--framework", "deepspeed", "--knob", "offload_param=cpu", "--json"))
    assert "needs ZeRO stage 3" in error and "set zero_stage=3" in error
    error = _refused(_run("ablate", "--framework", "megatron", "--knob", "overlap_param_gather=true", "--json"))
    assert error.startswith("--overlap-param-gather only supported with distributed optimizer")
    assert not (workspace / "runs").exists()


def test_a_deepspeed_drill_without_checkpoints_is_refused():
    error = _refused(_run("drill", "--framework", "deepspeed", "--json"))
    assert error.startswith("checkpoint.enable: the job writes no checkpoints")


def test_sop_refuses_a_knob_value_the_framework_does_not_take_before_running(workspace):
    error = _refused(_run("sop", "--quick", "--framework", "deepspeed", "--knob", "zero_stage=9", "--json"))
    assert "zero_stage" in error and "9" in error
    assert not (workspace / "runs").exists() or not any((workspace / "runs").iterdir())


def test_the_evidence_command_for_a_framework_job_is_one_the_cli_accepts(workspace, monkeypatch):
    """An evidence row's command must run: the real CLI parses it; the launch itself is cut off."""
    seen = []

    def measure(req, repeats, progress=None):
        seen.append((req, repeats))
        raise ValueError("stopped before launch")

    monkeypatch.setattr(skill_baseline, "measure", measure)
    line = command_line(JobRequest(framework="deepspeed", nproc=2, overrides=["training.steps=4"]))
    result = _run(*shlex.split(line)[1:], "--json")
    assert seen, result.stdout
    req, repeats = seen[0]
    assert (req.framework, req.nproc, repeats) == ("deepspeed", 2, 1)
    assert req.overrides == ["model.preset=tiny", "training.steps=4"] and req.preset == "tiny"
