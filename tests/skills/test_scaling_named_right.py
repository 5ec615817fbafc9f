"""Scaling figures named right (issue 24, item 5): the small-scale arm of an ablation keeps the
per-rank batch, so the global batch grows with the world size and the per-rank throughput ratio
is a weak-scaling efficiency; a comparison whose global batch stayed fixed is strong scaling and
is not passed off as weak."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.settings import read_toml
from trainops.skills.ablation import judge_scale
from trainops.skills.baseline import RepeatResult
from trainops.skills.evidence.pack import assemble
from trainops.skills.evidence.view import build
from trainops.skills.knobs import CATALOGUE
from trainops.tools.jobs.jobs import RunSummary
from trainops.trainer.config import load_config

runner = CliRunner()


@pytest.mark.slow
def test_the_weak_scaling_arm_grows_the_global_batch_with_the_world_size():
    # micro_batch 1 -> 4 is a gain at every rung (one accumulation pass instead of four), so the ladder
    # climbs to the target rather than stopping at one process
    result = runner.invoke(app, ["ablate", "--knob", "micro_batch=4", "--repeats", "1", "--nproc", "2",
                                 "--set", "training.steps=4", "--set", "training.micro_batch=1", "--json"])
    assert result.exit_code == 0, result.output
    small, target = json.loads(result.stdout)
    assert (small["scale_kind"], target["scale_kind"]) == ("small", "target")
    assert (small["labels"]["world_size"], small["labels"]["global_batch"]) == (1, 4)
    assert (target["labels"]["world_size"], target["labels"]["global_batch"]) == (2, 8)

    ran = read_toml(Path(small["source_run"]) / "config.toml")["training"]
    assert (ran["global_batch"], ran["micro_batch"]) == (4, 4)  # the same per-rank batch as at 2 processes
    assert target["weak_scaling_efficiency_pct"] > 0
    assert "global batch 4 at 1 process" in target["scaling_basis"]
    assert "8 at 2 processes" in target["scaling_basis"]
    assert target["labels"]["framework_version"] != "undeclared"


def _runs(tmp_path, name: str, mfu: float, tokens_per_s: float, global_batch: int, world: int) -> list:
    run = tmp_path / name
    run.mkdir()
    (run / "config.toml").write_text(load_config(preset="tiny", overrides=[
        f"training.global_batch={global_batch}"]).to_toml())
    summary = RunSummary(run=name, ranks=world, steps_measured=4, step_time_median_s=0.1,
                         step_time_rank_spread_pct=None, tokens_per_s_median=tokens_per_s, mfu_pct_median=mfu,
                         data_wait_share_pct=None, final_loss=None)
    return [RepeatResult(job_id="j", run_dir=str(run), summary=summary, started=0, ended=1, world_size=world)]


def test_a_fixed_global_batch_is_strong_scaling_and_not_called_weak(tmp_path, factories):
    small = factories.ablation(change=12.0, band=5.0, verdict="gain")
    target = factories.ablation(change=8.0, band=5.0, verdict="gain").model_copy(update={"scale_kind": "target"})
    fixed = {1: _runs(tmp_path, "small", 2.0, 1000.0, 8, 1), 2: _runs(tmp_path, "target", 1.8, 1800.0, 8, 2)}
    with pytest.raises(ValueError, match="strong scaling"):
        judge_scale(CATALOGUE["data_kind"], [small, target], fixed)


def test_a_grown_global_batch_is_weak_scaling(tmp_path, factories):
    small = factories.ablation(change=12.0, band=5.0, verdict="gain")
    target = factories.ablation(change=8.0, band=5.0, verdict="gain").model_copy(update={"scale_kind": "target"})
    grown = {1: _runs(tmp_path, "small", 2.0, 1000.0, 4, 1), 2: _runs(tmp_path, "target", 1.8, 1800.0, 8, 2)}
    row = judge_scale(CATALOGUE["data_kind"], [small, target], grown)
    assert row.weak_scaling_efficiency_pct == pytest.approx(90.0)
    assert row.scaling_basis.startswith("weak scaling: global batch 4 at 1 process -> 8 at 2 processes")


def test_the_report_names_the_scaling_basis(factories):
    row = factories.ablation().model_copy(update={"scale_kind": "target", "weak_scaling_efficiency_pct": 91.0,
                                             "scaling_basis": "weak scaling: global batch 4 at 1 process -> 8 at "
                                                              "2 processes (4 per data-parallel rank)"})

    view = build(assemble("p", factories.environment(), factories.baseline(["r"]), [row], [factories.drill()], []))
    (table,) = [t for s in view.sections if s.key == "s3" for t in s.tables]
    assert "weak-scaling efficiency" in table.headers
    cell = table.rows[0][table.headers.index("weak-scaling efficiency")]
    assert "91%" in cell.text and "global batch 4 at 1 process" in cell.text
