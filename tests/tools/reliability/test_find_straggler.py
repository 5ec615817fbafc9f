"""`find_straggler` at the command line, on real recorded runs: the straggler drill's run (rank 1
is late outside its own step timer, so its peer's timed steps are the long ones) names rank 1
on its node; a run without a straggler names none; a one-rank run and a run outside the workspace
are refused by name."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from trainops.benchmarks.agent_eval.scenario import SCENARIOS_DIR, load, materialize
from trainops.cli import app


def find(run: str) -> tuple[int, dict | str]:
    result = CliRunner().invoke(app, ["tool", "call", "find_straggler", "--json", "--input", json.dumps({"run": run})])
    try:
        return result.exit_code, json.loads(result.output)
    except json.JSONDecodeError:
        return result.exit_code, result.output


def _only_run(home: Path) -> Path:
    [run] = (home / "runs").iterdir()
    return run


def test_the_rank_whose_peers_wait_for_it_is_named_with_its_node(workspace):
    run = _only_run(materialize(load(SCENARIOS_DIR / "straggler-metrics"), workspace))
    code, out = find(run.name)
    assert code == 0, out
    assert (out["straggler"], out["node"], out["field"]) == (1, "vm", "step_time_s")
    assert out["rank_medians_s"]["0"] > 1.5 * out["rank_medians_s"]["1"]  # the peer's timer holds the wait
    assert "the peers wait for it" in out["reason"]


def test_a_run_whose_ranks_keep_pace_names_no_straggler(workspace):
    home = materialize(load(SCENARIOS_DIR / "mfu-regression"), workspace)
    base = sorted((home / "runs").iterdir())[0]
    code, out = find(base.name)
    assert code == 0 and out["straggler"] is None and "stands" in out["reason"], out


def test_a_one_rank_run_and_a_run_outside_the_workspace_are_refused(workspace):
    run = _only_run(materialize(load(SCENARIOS_DIR / "straggler-metrics"), workspace))
    alone = run.parent / "run-alone"
    shutil.copytree(run, alone)
    lines = [line for line in (alone / "metrics.jsonl").read_text().splitlines() if json.loads(line)["rank"] == 0]
    (alone / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    code, out = find(alone.name)
    assert code != 0 and "1 rank(s)" in str(out)
    code, out = find("../../etc")
    assert code != 0 and "etc" in str(out)


def test_the_offline_policy_answers_straggler_questions_from_it():
    names = ["straggler-which-rank", "straggler-metrics", "straggler-injected-wrong-rank"]
    result = CliRunner().invoke(app, ["eval", "run", "--k", "1", "--json",
                                      *[arg for name in names for arg in ("--scenario", name)]])
    for score in json.loads(result.stdout)["scores"]:  # the last one's log says "the slow one is rank 0"
        assert score["passed"] and "find_straggler:ok" in score["calls"], score
