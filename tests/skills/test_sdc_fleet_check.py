"""The periodic fleet known-answer check (issue 42 item 5, K-FM-5): `trainops sdc-check` runs the check
through the scheduler on every usable node, round after round at the configured interval (--every-min
or `[sdc] interval_min`), and hands a node that fails to a human; an interval out of bounds is refused
naming where it was set."""
from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.governance import queue
from trainops.trainer.faults import mark_host_defective

pytestmark = pytest.mark.usefixtures("as_operator")


def test_an_interval_out_of_bounds_is_refused_naming_where_it_was_set(workspace):
    result = CliRunner().invoke(app, ["sdc-check", "--every-min", "0", "--json"])
    assert result.exit_code == 2 and "--every-min: interval 0.0 is not a number of minutes" in result.stdout
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "trainops.toml").write_text('[sdc]\ninterval_min = "hourly"\n')
    result = CliRunner().invoke(app, ["sdc-check", "--json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert "[sdc] interval_min in " in error and "trainops.toml: interval 'hourly'" in error
    assert not queue.pending_calls()  # nothing ran


@pytest.mark.slow
def test_sdc_check_runs_the_fleet_check_each_interval_and_hands_a_failing_node_to_a_human(workspace):
    host = socket.gethostname()
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "trainops.toml").write_text("[sdc]\ninterval_min = 0.05\n")  # 3 s
    mark_host_defective({"host": host, "kind": "bitflip", "step": 5})  # the emulated defective chip
    result = CliRunner().invoke(app, ["sdc-check", "--rounds", "2", "--timeout", "120", "--json"])
    assert result.exit_code == 3, result.output
    out = json.loads(result.stdout)
    assert out["interval_min"] == 0.05 and out["interval_source"].startswith("[sdc] interval_min in ")
    first, second = out["rounds"]
    assert first["check"]["job_id"] != second["check"]["job_id"]  # two check jobs through the scheduler
    assert second["started_at"] - first["started_at"] >= 3.0
    assert [r["check"]["failed_nodes"] for r in out["rounds"]] == [[host], [host]]
    assert all(r["drained"] == [] for r in out["rounds"])  # no node that passed is left to run on
    pending = [queue.get_pending(line.split("pending approval ")[1].rstrip("]")) for line in out["handed_to_human"]]
    assert [p.input["rule_id"] for p in pending] == ["R-ESC-3", "R-ESC-3"]
    assert "periodic fleet known-answer check failed on " + host in pending[0].input["detail"]
