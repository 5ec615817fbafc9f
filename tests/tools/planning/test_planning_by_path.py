"""The planners take the measured restart of the recovery path the job will use (issue 27 item 3):
in-process restart onto a spare and a requeue cost different times, so one number for all would plan
the wrong interval. The figure is the median of that path's drill records and the trainer's own
RUN/recoveries.jsonl entries, and the output names the path and where the number came from."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.record_keys import run_key
from trainops.run_folder import RunFiles
from trainops.run_records import RecoveryEntry
from trainops.tools.base import ToolError
from trainops.tools.calls import call


def _drill(workspace, run: str, path: str, detection_s: float, recovery_s: float) -> None:
    folder = workspace / "runs" / run
    folder.mkdir(parents=True)
    record = {"fault": "crash", "injected_time": 1_000.0, "detection_latency_s": detection_s,
              "recovery_time_s": recovery_s, "recovery_path": path}
    (folder / "drill.json").write_text(json.dumps(record))


def _trainer_recovery(workspace, run: str, detect_s: float, total_s: float) -> None:
    folder = workspace / "runs" / run
    folder.mkdir(parents=True, exist_ok=True)
    entry = RecoveryEntry(time=2_000.0, path="spare-admitted", failed_ranks=[1], generation=1, resumed_step=4,
                          source="storage", phases_s={"detect": detect_s}, total_s=total_s)
    with RunFiles(folder).recoveries.open("a") as fh:  # sealed as the supervisor trainops launched seals it
        fh.write(entry.sealed(run_key(folder, create=True)).model_dump_json() + "\n")


def _plan(path: str):
    return call("plan_checkpoint_interval", {"save_s": 2.0, "mtbf_h": 5.0, "restart_from": "measured_path",
                                             "recovery_path": path})


def test_each_path_plans_with_its_own_measured_restart_and_names_it(workspace):
    _drill(workspace, "requeued", "requeue", 0.01, 3.6)
    _drill(workspace, "spare-a", "spare-admitted", 0.02, 1.0)
    _trainer_recovery(workspace, "spare-a", 0.5, 50.0)  # the drill's own recovery: counted once, from its record
    _drill(workspace, "spare-b", "spare-admitted", 0.04, 1.4)
    _trainer_recovery(workspace, "production", 0.06, 1.2)  # no drill: the trainer's record counts

    requeue, spare = _plan("requeue"), _plan("spare-admitted")
    assert requeue.restart_s == pytest.approx(0.01 + 3.6) and requeue.restart_path == "requeue"
    assert spare.restart_s == pytest.approx(0.04 + 1.2)  # medians of (0.02, 0.04, 0.06) and (1.0, 1.4, 1.2)
    assert "median of 3 spare-admitted recoveries" in spare.restart_source
    assert "2 drill record(s), 1 trainer record(s)" in spare.restart_source
    assert spare.expected_waste_fraction < requeue.expected_waste_fraction

    ettr = call("plan_effective_training_time", {"gpus": 1024, "days": 5, "restart_from": "measured_path",
                                                 "recovery_path": "requeue"})
    by_hand = call("plan_effective_training_time", {"gpus": 1024, "days": 5, "detection_latency_s": 0.01,
                                                    "restart_s": 3.6})
    assert ettr.ettr == by_hand.ettr and ettr.restart_path == "requeue" and "1 drill record(s)" in ettr.restart_source


def test_a_path_never_measured_is_refused_naming_it_not_planned_with_another_paths_number(workspace):
    _drill(workspace, "requeued", "requeue", 0.01, 3.6)
    _drill(workspace, "unknown", None, 0.01, 0.5)  # a drill whose records could not tell the path
    with pytest.raises(ToolError, match="no measured in-process recovery"):
        _plan("in-process")


def test_a_path_goes_with_measured_path_only():
    with pytest.raises(ToolError, match="recovery_path: give it exactly when"):
        call("plan_checkpoint_interval", {"save_s": 2.0, "mtbf_h": 5.0, "restart_s": 3.0, "recovery_path": "requeue"})
    with pytest.raises(ToolError, match="recovery_path: give it exactly when"):
        call("plan_effective_training_time", {"restart_from": "measured_path"})


def test_the_tool_command_plans_by_path(workspace):
    _drill(workspace, "requeued", "requeue", 0.01, 3.6)
    out = CliRunner().invoke(app, ["tool", "call", "plan_checkpoint_interval", "--json", "--input", json.dumps(
        {"save_s": 2.0, "mtbf_h": 5.0, "restart_from": "measured_path", "recovery_path": "requeue"})])
    assert out.exit_code == 0, out.output
    assert '"restart_path": "requeue"' in out.stdout and "3.61" in out.stdout


def test_the_plan_commands_take_the_recovery_path(workspace):
    _drill(workspace, "requeued", "requeue", 0.01, 3.6)
    _drill(workspace, "spare-a", "spare-admitted", 0.02, 1.0)
    runner = CliRunner()
    checkpoint = runner.invoke(app, ["plan", "checkpoint", "--save-s", "2", "--mtbf-h", "5", "--restart-from",
                                     "measured_path", "--recovery-path", "spare-admitted", "--json"])
    assert checkpoint.exit_code == 0, checkpoint.output
    planned = json.loads(checkpoint.stdout)
    assert planned["restart_path"] == "spare-admitted" and planned["restart_s"] == pytest.approx(1.02)
    ettr = runner.invoke(app, ["plan", "ettr", "--gpus", "1024", "--days", "5", "--restart-from", "measured_path",
                               "--recovery-path", "requeue", "--json"])
    assert ettr.exit_code == 0, ettr.output
    assert json.loads(ettr.stdout)["restart_path"] == "requeue"
    unknown = runner.invoke(app, ["plan", "checkpoint", "--save-s", "2", "--mtbf-h", "5", "--restart-from",
                                  "measured_path", "--recovery-path", "reboot"])
    assert unknown.exit_code != 0 and "recovery_path" in unknown.output and "spare-admitted" in unknown.output
