"""The planners take the restart time measured by the newest multi-node drill in the workspace
(detection + isolation + requeue + load) and say which drill it came from."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.base import ToolError
from trainops.tools.calls import call


def _drill_record(workspace, run: str, injected_time: float, detection_s: float, recovery_s: float,
                  node_drill: bool = True) -> None:
    folder = workspace / "runs" / run
    folder.mkdir(parents=True)
    record = {"fault": "partition" if node_drill else "crash", "injected_time": injected_time,
              "detection_latency_s": detection_s, "recovery_time_s": recovery_s}
    if node_drill:
        record["node_timeline"] = [{"t_s": 0.0, "node": "n2", "event": "injected partition"}]
    (folder / "drill.json").write_text(json.dumps(record))


def test_the_checkpoint_plan_uses_the_newest_node_drills_restart_and_names_it(workspace):
    _drill_record(workspace, "old", 1_000.0, 0.01, 9.0)
    _drill_record(workspace, "new", 2_000.0, 5.2, 11.9)
    _drill_record(workspace, "newest-single-node", 3_000.0, 0.1, 1.0, node_drill=False)
    plan = call("plan_checkpoint_interval", {"save_s": 2.0, "mtbf_h": 5.0, "restart_from": "newest_node_drill"})
    assert plan.restart_s == pytest.approx(5.2 + 11.9)
    assert plan.restart_source.startswith("measured: partition drill")
    assert "runs/new/drill.json" in plan.restart_source
    given = call("plan_checkpoint_interval", {"save_s": 2.0, "mtbf_h": 5.0, "restart_s": 5.2 + 11.9})
    assert given.expected_waste_fraction == pytest.approx(plan.expected_waste_fraction)
    assert given.restart_source == "given by the caller"


def test_the_ettr_estimate_uses_the_drills_detection_and_recovery(workspace):
    _drill_record(workspace, "new", 2_000.0, 5.2, 11.9)
    measured = call("plan_effective_training_time", {"gpus": 1024, "days": 5, "restart_from": "newest_node_drill"})
    by_hand = call("plan_effective_training_time", {"gpus": 1024, "days": 5, "detection_latency_s": 5.2,
                                                    "restart_s": 11.9})
    assert measured.ettr == by_hand.ettr
    assert "runs/new/drill.json" in measured.restart_source


def test_without_a_node_drill_the_planner_says_how_to_make_one(workspace):
    _drill_record(workspace, "single", 1_000.0, 0.1, 1.0, node_drill=False)
    with pytest.raises(ToolError, match="no multi-node drill record.*--fault node-crash"):
        call("plan_checkpoint_interval", {"save_s": 2.0, "mtbf_h": 5.0, "restart_from": "newest_node_drill"})


def test_a_restart_time_is_given_or_measured_not_both_nor_neither():
    with pytest.raises(ToolError, match="restart_s: give it"):
        call("plan_checkpoint_interval", {"save_s": 2.0, "mtbf_h": 5.0})
    with pytest.raises(ToolError, match="restart_s: give it"):
        call("plan_checkpoint_interval", {"save_s": 2.0, "mtbf_h": 5.0, "restart_s": 3.0,
                                          "restart_from": "newest_node_drill"})


def test_the_plan_commands_take_the_measured_restart_with_restart_from(workspace):
    _drill_record(workspace, "new", 2_000.0, 5.2, 11.9)
    runner = CliRunner()
    checkpoint = runner.invoke(app, ["plan", "checkpoint", "--save-s", "2", "--mtbf-h", "5",
                                     "--restart-from", "newest_node_drill", "--json"])
    assert checkpoint.exit_code == 0, checkpoint.output
    assert json.loads(checkpoint.stdout)["restart_s"] == pytest.approx(5.2 + 11.9)
    ettr = runner.invoke(app, ["plan", "ettr", "--gpus", "1024", "--days", "5", "--restart-from", "newest_node_drill",
                               "--json"])
    assert ettr.exit_code == 0, ettr.output
    assert "runs/new/drill.json" in json.loads(ettr.stdout)["restart_source"]
