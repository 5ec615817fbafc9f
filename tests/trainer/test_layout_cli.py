"""`trainops train --dry-run`: validates and plans per rank without launching anything."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from trainops.cli import app


def invoke(*args: str):
    return CliRunner().invoke(app, ["train", *args])


def test_dry_run_json_plans_every_rank_and_launches_nothing(workspace):
    result = invoke("--preset", "tiny", "--nproc", "4", "--set", "parallel.pp=2", "--set", "parallel.tp=2",
                    "--set", "training.micro_batch=2", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["mesh_shape"] == [2, 1, 1, 1, 2]
    assert [r["layers"] for r in plan["ranks"]] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert set(plan["formulas"]) >= {"param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes"}
    assert not (workspace / "runs").exists()


def test_dry_run_rejects_an_impossible_layout_in_one_line():
    result = invoke("--preset", "tiny", "--nproc", "6", "--set", "parallel.tp=4", "--dry-run", "--json")
    assert result.exit_code == 2
    error = json.loads(result.output)["error"]
    assert "world size 6 is not divisible by dp_replicate*cp*tp*pp = 1*1*4*1 = 4" in error
