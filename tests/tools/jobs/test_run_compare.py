"""`compare_runs` at the command line, on two real recorded runs (benchmarks/agent_eval's MFU pair:
the same model with micro_batch 4, then micro_batch 1 with full activation checkpointing): the
settings come from each run's saved config, the slower run from the metrics, never from the order
the caller gives; one changed setting is a candidate cause, several confound; bad input is named."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.agents.session import AgentSession
from trainops.benchmarks.agent_eval.scenario import SCENARIOS_DIR, load, materialize
from trainops.cli import app


@pytest.fixture
def pair(workspace) -> tuple[Path, Path]:
    home = materialize(load(SCENARIOS_DIR / "mfu-regression"), workspace)
    fast, slow = sorted((home / "runs").iterdir())  # recorded oldest first: the baseline, then the regressed run
    return fast, slow


def compare(baseline: str, candidate: str) -> tuple[int, dict | str]:
    result = CliRunner().invoke(app, ["tool", "call", "compare_runs", "--json", "--input",
                                      json.dumps({"baseline": baseline, "candidate": candidate})])
    try:
        return result.exit_code, json.loads(result.output)
    except json.JSONDecodeError:
        return result.exit_code, result.output


def test_two_changed_settings_are_named_and_reported_as_confounded(pair):
    fast, slow = pair
    code, out = compare(fast.name, slow.name)
    assert code == 0, out
    assert [(c["key"], c["baseline"], c["candidate"]) for c in out["changed"]] == [
        ("training.activation_checkpointing", "none", "full"), ("training.micro_batch", "4", "1")]
    assert out["slower"] == slow.name and out["step_time_ratio"] > 1.5 and out["mfu_change_points"] < 0
    assert "confound" in out["finding"] and "ablate each alone" in out["finding"]


def test_the_slower_run_is_read_from_the_metrics_whatever_the_order_given(pair):
    fast, slow = pair
    code, out = compare(slow.name, fast.name)  # the regressed run given as the baseline
    assert code == 0 and out["slower"] == slow.name and out["step_time_ratio"] < 1
    assert [c["text"] for c in out["changed"]][0] == "training.activation_checkpointing: full -> none"


def _copy_with(run: Path, name: str, *, config_edit: tuple[str, str] | None = None, time_scale: float = 1.0) -> Path:
    copy = run.parent / name
    shutil.copytree(run, copy)
    if config_edit:
        config = copy / "config.toml"
        config.write_text(config.read_text().replace(*config_edit))
    lines = [json.loads(line) for line in (copy / "metrics.jsonl").read_text().splitlines()]
    (copy / "metrics.jsonl").write_text("".join(json.dumps({**r, "step_time_s": r["step_time_s"] * time_scale}) + "\n"
                                                for r in lines))
    return copy


def test_one_changed_setting_is_the_candidate_cause(pair):
    fast, _ = pair
    arm = _copy_with(fast, "run-arm", config_edit=('data_parallel = "fsdp"', 'data_parallel = "ddp"'), time_scale=1.4)
    code, out = compare(fast.name, arm.name)
    assert code == 0, out
    assert [c["text"] for c in out["changed"]] == ["parallel.data_parallel: fsdp -> ddp"]
    assert out["slower"] == arm.name and "one setting differs" in out["finding"] and "candidate cause" in out["finding"]


def test_same_settings_and_a_slowdown_point_away_from_the_config(pair):
    fast, _ = pair
    again = _copy_with(fast, "run-again", time_scale=1.3)
    code, out = compare(fast.name, again.name)
    assert code == 0 and out["changed"] == [] and out["slower"] == again.name
    assert "not the config" in out["finding"]


def test_within_the_noise_band_no_run_is_called_slower(pair):
    fast, _ = pair
    again = _copy_with(fast, "run-same", time_scale=1.02)
    code, out = compare(fast.name, again.name)
    assert code == 0 and out["slower"] is None and "within 5%" in out["finding"]


@pytest.mark.parametrize("baseline, candidate, named", [
    ("SAME", "SAME", "the same run"),
    ("../../etc", "SLOW", "etc"),
    ("run-nope", "SLOW", "run-nope"),
])
def test_bad_runs_are_named(pair, baseline, candidate, named):
    fast, slow = pair
    names = {"SAME": fast.name, "SLOW": slow.name}
    code, out = compare(names.get(baseline, baseline), names.get(candidate, candidate))
    assert code != 0 and named in str(out)


def test_a_config_that_does_not_load_is_named_with_the_file(pair):
    fast, slow = pair
    (slow / "config.toml").write_text("[training]\nmicro_batch = 'lots'\n")
    code, out = compare(fast.name, slow.name)
    assert code != 0 and "config.toml does not load" in str(out) and slow.name in str(out)


def test_the_comparison_states_what_its_mfu_figures_stand_on(pair):
    """A-ENV-5: no MFU statement without its basis: each run's model, layout, precision, ranks and the peak
    its MFU is measured against, read from the run's own config and metrics."""
    fast, slow = pair
    code, out = compare(fast.name, slow.name)
    assert code == 0, out
    basis = out["basis"]
    for run in (fast, slow):
        assert f"{run.name}: model tiny" in basis
    assert "dp_replicate x dp_shard x cp x tp x pp = " in basis and "fp32" in basis and "measured CPU GEMM" in basis


def test_the_agent_s_comparison_answer_declares_its_basis_before_the_mfu(pair):
    fast, slow = pair
    with AgentSession("compare-basis") as session:
        events = list(session.ask(f"why is run {slow.name} slower than run {fast.name}?"))
    text = next(e["text"] for e in events if e["kind"] == "answer")
    assert "Basis: " in text and "MFU" in text, text
    assert text.index("Basis: ") < text.index("MFU regression"), text
    assert f"{fast.name}: model tiny" in text and "read with: trainops " in text and "torch " in text
