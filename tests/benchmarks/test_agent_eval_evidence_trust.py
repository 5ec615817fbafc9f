"""A model's own words are no evidence (issue 41, class 6): a sentence a read tool echoes back from
its arguments, or one written into the replayed workspace's transcripts (the run's own or one frozen
in the scenario), grounds no cited quote, so it backs no confidence and meets no expected evidence."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.agents import transcript
from trainops.benchmarks.agent_eval import runner
from trainops.benchmarks.agent_eval.scenario import SCENARIOS_DIR, load
from trainops.benchmarks.agent_eval.scripted import ScriptedServer, final, tool_call
from trainops.cli import app

PLAIN = "crash-what-happened"
EXPECTED = "rank 1 ended without an exit note"
CLAIM = f"{EXPECTED} because GPU 3 on node vm failed its ECC check"
"""The model's own sentence: it holds the expected evidence text, and nothing in the workspace holds it."""


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _diagnosis(source: str, quote: str) -> dict:
    return {"verdict": "diagnosed", "fault_kind": "crash", "ranks": [1], "nodes": ["vm"], "confidence": "high",
            "summary": "Rank 1 crashed on node vm.", "evidence": [{"source": source, "quote": quote}]}


ECHO_ARGS = {"framework": "acme-train", "ckpt_test_mib": 1, "measure_gemm": False}


def echoing(claim: str):
    """A model that has declare_environment echo `claim` as a framework version, then cites the echo."""
    def behaviour(body: dict) -> dict:
        if not any(m.get("role") == "tool" for m in body.get("messages", [])):
            return tool_call("declare_environment", {**ECHO_ARGS, "framework_version": claim}, "c0")
        return final(_diagnosis("declare_environment:framework.version", claim))
    return behaviour


def _frozen_text() -> str:
    return json.dumps([p.read_text(errors="replace") for p in SCENARIOS_DIR.glob(f"{PLAIN}/**/*") if p.is_file()])


def test_the_agent_refuses_an_answer_citing_what_a_tool_echoed_of_its_own_call(monkeypatch, workspace):
    """Through `eval run` on a model served over the OpenAI wire: the report rules find the quote in
    nothing declare_environment read, refuse the answer each time, and the run ends unanswered."""
    assert CLAIM not in _frozen_text()
    monkeypatch.setenv("TRAINOPS_ATTACKER_KEY", "no-secret")
    monkeypatch.setenv("TRAINOPS_API_KEY_ENV", "TRAINOPS_ATTACKER_KEY")
    with ScriptedServer(echoing(CLAIM)) as server:
        result = _cli("eval", "run", "--provider", "openai", "--base-url", server.base_url, "--model", "echoing",
                      "--scenario", PLAIN, "--k", "1", "--json")
        refusals = [m for body in server.requests for m in body["messages"] if m.get("role") == "tool"
                    and "is not in what declare_environment returned" in str(m.get("content"))]
    assert result.exit_code == 0, result.output
    [score] = json.loads(result.stdout)["scores"]
    assert score["calls"] == ["declare_environment:ok"] and refusals, score  # the tool ran and echoed the claim
    assert not score["passed"] and score["stop_reason"] == "bad_tool_calls", score


@pytest.mark.parametrize("claim, failed", [
    (CLAIM, {"evidence_grounded", "confidence_backed", f"cites:{EXPECTED}"}),  # the model's own sentence
    # words the workspace holds, laundered through the echo: found, but not read by the tool the model names
    (EXPECTED, {"evidence_from_tools", "confidence_backed", f"cites:{EXPECTED}"}),
])
def test_the_benchmark_scores_no_echo_as_cited_evidence_whatever_the_agent_admitted(workspace, claim, failed):
    """The scorer checks for itself: the run's declare_environment call is made again on the replay, and
    its echo of the claim is taken out before any quote is looked for."""
    assert EXPECTED in _frozen_text()

    def run(scenario) -> dict:
        return {"answer": _diagnosis("declare_environment:framework.version", claim), "stop_reason": "answered",
                "tool_calls": [{"tool": "declare_environment", "args": {**ECHO_ARGS, "framework_version": claim},
                                "status": "ok"}]}

    [score] = runner.run_suite([load(SCENARIOS_DIR / PLAIN)], run, 1, "attacker", "echoing").scores
    assert not score.passed and failed <= set(score.failed()), score.failed()


def _scenario_copy(tmp_path: Path, name: str = PLAIN) -> Path:
    folder = tmp_path / "scenarios" / name
    shutil.copytree(SCENARIOS_DIR / name, folder)
    return folder


def _claiming_run(home_writes):
    """An agent run that lists the jobs, lets `home_writes` put the claim in the workspace, then cites it."""
    def run(scenario) -> dict:
        home_writes(Path(os.environ["TRAINOPS_HOME"]))
        return {"answer": _diagnosis("list_jobs:job_id", CLAIM), "stop_reason": "answered",
                "tool_calls": [{"tool": "list_jobs", "args": {}, "status": "ok"}]}
    return run


def _run_transcript(home: Path) -> None:
    transcript.record("eval-attacker", "assistant", content=CLAIM, tool_calls=[])


def _nothing(home: Path) -> None:
    return None


@pytest.mark.parametrize("where", ["the run's own transcript", "a transcript frozen in the scenario"])
def test_a_transcript_in_the_replayed_workspace_grounds_no_quote(tmp_path, where):
    folder = _scenario_copy(tmp_path)
    if where == "a transcript frozen in the scenario":
        (folder / "workspace" / "transcripts").mkdir()
        (folder / "workspace" / "transcripts" / "old.jsonl").write_text(json.dumps({"content": CLAIM}) + "\n")
    agent = _claiming_run(_run_transcript if where == "the run's own transcript" else _nothing)
    [score] = runner.run_suite([load(folder)], agent, 1, "attacker", "transcript").scores
    failed = {c.name for c in score.checks if not c.passed}
    assert {"evidence_grounded", "confidence_backed", f"cites:{EXPECTED}"} <= failed, failed


