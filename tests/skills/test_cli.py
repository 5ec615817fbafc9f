"""The SOP commands at the command line: JSON for machines, one clear line and exit 2 for refusals."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app

runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, list(args))


def test_ablate_list_shows_the_catalogue_in_plan_order():
    result = _run("ablate", "--list", "--json")
    assert result.exit_code == 0
    categories = [k["category"] for k in json.loads(result.stdout)]
    assert categories.index("communication-overlap") < categories.index("kernels") < categories.index("batch")


def test_unknown_knob_is_refused_naming_the_knob():
    result = _run("ablate", "--knob", "warp_speed=9", "--json")
    assert result.exit_code == 2
    assert "unknown knob 'warp_speed'" in json.loads(result.stdout)["error"]


def test_two_knobs_in_one_arm_are_refused():
    result = _run("ablate", "--knob", "data_kind=synthetic,micro_batch=8", "--json")
    assert result.exit_code == 2
    assert "exactly one variable" in json.loads(result.stdout)["error"]


def test_drill_on_a_job_without_checkpoints_is_refused():
    result = _run("drill", "--fault", "crash", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"].startswith("checkpoint.enable: the job writes no checkpoints")


def test_unknown_fault_is_refused():
    result = _run("drill", "--fault", "meteor", "--set", "checkpoint.enable=true", "--json")
    assert result.exit_code == 2 and "unknown fault 'meteor'" in result.stdout


def test_evidence_show_of_a_missing_pack_says_where_it_looked():
    result = _run("evidence", "show", "nope", "--json")
    assert result.exit_code == 2 and "no pack 'nope'" in result.stdout


def test_skill_list_names_every_skill():
    result = _run("skill", "list", "--json")
    assert result.exit_code == 0
    assert "training-efficiency-ablation-and-fault-sop" in {s["name"] for s in json.loads(result.stdout)}


def test_evidence_build_from_runs_writes_a_partial_pack(factories, workspace):
    # tools read only inside the workspace
    runs = [str(factories.write_run(workspace / "runs" / f"run-{i}")) for i in (1, 2)]
    result = _run("evidence", "build", *runs, "--json")
    assert result.exit_code == 0, result.stdout
    pack = Path(json.loads(result.stdout)["pack_dir"])
    first = (pack / "report.md").read_text().splitlines()[0]
    assert first.startswith("Verdict: PARTIAL — blockers: baseline has 2 repeat(s)")
    assert "no ablation arms run" in first and "no fault drill run" in first


@pytest.mark.slow
def test_sop_quick_ends_with_a_pack_awaiting_approval(quick_sop):
    """The product's main job, for real: torchrun on the local scheduler, 2 gloo processes."""
    out = quick_sop
    assert out["verdict"] in {"pass", "partial", "fail"}
    pack = Path(out["pack_dir"])
    assert (pack / "report.md").read_text().startswith(f"Verdict: {out['verdict'].upper()}")
    evidence = json.loads((pack / "evidence.json").read_text())
    assert evidence["fault_tolerance"]["drills"][0]["async_checkpoint_intact"] is True
    assert not (pack / "approval.json").exists()


def test_sop_refuses_an_unknown_knob_before_running_anything(workspace):
    result = _run("sop", "--quick", "--knob", "warp_speed=9", "--json")
    assert result.exit_code == 2 and "unknown knob 'warp_speed'" in result.stdout
    assert not (workspace / "runs").exists() or not any((workspace / "runs").iterdir())


def test_sop_refuses_a_missing_config_file():
    result = _run("sop", "no-such.toml", "--json")
    assert result.exit_code == 2 and "CONFIG: file 'no-such.toml' does not exist" in result.stdout


def test_skill_run_forwards_to_the_skill_command():
    result = _run("skill", "run", "ablation", "--list", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["category"] == "communication-overlap"


SKILL_COMMANDS = {"ablation": "ablate", "baseline": "baseline", "checkpoint-plan": "plan checkpoint",
                  "environment-declaration": "env", "evidence-pack": "evidence build", "fault-drill": "drill",
                  "training-efficiency-ablation-and-fault-sop": "sop"}


def test_skill_run_reaches_the_command_every_listed_skill_declares():
    """Each SKILL.md names its command (metadata.cli) and `skill run NAME` finds it in the whole
    `trainops` app, not only among the SOP commands (env and plan live elsewhere)."""
    listed = json.loads(_run("skill", "list", "--json").stdout)
    assert {s["name"] for s in listed} == set(SKILL_COMMANDS)
    for skill in listed:
        command = SKILL_COMMANDS[skill["name"]]
        assert skill["cli"].startswith(f"trainops {command}"), skill
        result = runner.invoke(app, ["skill", "run", skill["name"], "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (skill["name"], result.output)
        assert f"Usage: trainops {command} [OPTIONS]" in result.output, (skill["name"], result.output)


def test_skill_run_passes_its_arguments_to_a_command_outside_the_sop_commands():
    result = _run("skill", "run", "checkpoint-plan", "--save-s", "30", "--restart-s", "60", "--mtbf-h", "24", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["restart_s"] == 60


def test_skill_run_of_an_unknown_skill_names_the_known_ones():
    result = _run("skill", "run", "warp-drive", "--json")
    assert result.exit_code == 2 and "skill 'warp-drive' not found; known skills: ablation" in result.stdout


def test_python_dash_m_trainops_runs_the_cli(workspace):
    """Subprocesses (the scenario recipe's drills and runs) call the CLI as `python -m trainops`; a
    module that only defines the app would exit 0 having done nothing."""
    done = subprocess.run([sys.executable, "-m", "trainops", "ablate", "--list"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "micro_batch" in done.stdout, done.stderr
    wrong = subprocess.run([sys.executable, "-m", "trainops", "drill", "--fault", "nonsense"], capture_output=True,
                           text=True, timeout=60)
    assert wrong.returncode != 0 and "nonsense" in wrong.stdout + wrong.stderr
