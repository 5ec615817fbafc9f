"""The checkpoint plan says how much of the storage's write bandwidth it takes: checkpoint bytes
per interval over the measured write bandwidth, given or read from a run's checkpoint journal
(issue 24, item 8)."""
from __future__ import annotations

import json

import pytest

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.workspace import runs_dir

GIB = 2**30


def test_occupancy_is_checkpoint_bytes_per_interval_over_the_write_bandwidth():
    out = call("plan_checkpoint_interval", {"save_s": 10, "restart_s": 60, "mtbf_h": 24,
                                            "checkpoint_bytes": 100 * GIB, "write_bandwidth_mib_s": 1024})
    occupancy = out.write_occupancy
    interval_s = out.daly_interval_min * 60
    assert occupancy.write_s == pytest.approx(100.0)  # 100 GiB at 1 GiB/s
    assert occupancy.interval_s == pytest.approx(interval_s)
    assert occupancy.occupancy_fraction == pytest.approx(100.0 / interval_s)
    assert occupancy.demand_mib_s == pytest.approx(100 * 1024 / interval_s)
    assert f"{occupancy.occupancy_fraction:.2%} of the write bandwidth" in out.recommendation


def test_occupancy_is_measured_from_the_run_checkpoint_journal():
    run = runs_dir() / "ckpt-run"
    run.mkdir(parents=True)
    saves = [{"event": "save", "step": s, "stall_s": 0.5, "write_s": 2.0, "size_bytes": 4 * GIB, "time": 1000.0 + s}
             for s in (5, 10, 15)]
    (run / "checkpoints.jsonl").write_text("".join(json.dumps(s) + "\n" for s in saves))
    out = call("plan_checkpoint_interval", {"save_s": 0.5, "restart_s": 30, "mtbf_h": 10, "run": "ckpt-run"})
    occupancy = out.write_occupancy
    assert occupancy.checkpoint_bytes == 4 * GIB
    assert occupancy.write_bandwidth_mib_s == pytest.approx(2048.0)  # 12 GiB over 6 s of writing
    assert occupancy.basis.startswith("measured: 3 save(s) in ckpt-run")
    assert occupancy.occupancy_fraction == pytest.approx(2.0 / (out.daly_interval_min * 60))


def test_a_run_without_journalled_sizes_names_the_fields_to_pass_instead():
    (runs_dir() / "empty-run").mkdir(parents=True)
    with pytest.raises(ToolError, match="journals no checkpoint.*pass checkpoint_bytes and write_bandwidth_mib_s"):
        call("plan_checkpoint_interval", {"save_s": 1, "restart_s": 30, "mtbf_h": 10, "run": "empty-run"})


def test_bytes_without_a_bandwidth_is_refused_naming_both_fields():
    with pytest.raises(ToolError, match="checkpoint_bytes and write_bandwidth_mib_s: give both"):
        call("plan_checkpoint_interval", {"save_s": 1, "restart_s": 30, "mtbf_h": 10, "checkpoint_bytes": GIB})


def test_the_escalation_threshold_is_unchanged_by_the_occupancy():
    """R-ESC-4's line stays CHECKPOINT_TOO_SLOW on the save overhead, whatever the occupancy says."""
    out = call("plan_checkpoint_interval", {"save_s": 600, "restart_s": 60, "mtbf_h": 24,
                                            "checkpoint_bytes": GIB, "write_bandwidth_mib_s": 1e6})
    assert out.escalation == "two_phase_async" and out.write_occupancy.occupancy_fraction < 1e-3
