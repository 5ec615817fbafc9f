"""The checkpoint plan uses the drill's measured costs, through the planning tool."""
from __future__ import annotations

import json

import pytest

from trainops.skills.planning import plan_from_drill


def test_checkpoint_plan_takes_stall_from_the_journal_and_restart_from_the_drill(factories, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with open(run / "checkpoints.jsonl", "w") as fh:
        for step, stall in ((2, 0.02), (4, 0.04), (6, 0.03)):
            fh.write(json.dumps({"event": "save", "step": step, "stall_s": stall, "write_s": 0.3}) + "\n")
        fh.write(json.dumps({"event": "load", "step": 4}) + "\n")
    drill = factories.drill().model_copy(update={"run_dir": str(run)})
    plan = plan_from_drill(drill, mtbf_h=24.0, mtbf_basis="declared")
    assert plan.save_stall_s == pytest.approx(0.03) and plan.write_s == pytest.approx(0.3)
    assert plan.restart_s == drill.recovery_time_s
    # Young: sqrt(2 * C * M) with C = 0.03 s, M = 24 h
    assert plan.young_interval_min == pytest.approx((2 * 0.03 * 24 * 3600) ** 0.5 / 60, rel=1e-6)
