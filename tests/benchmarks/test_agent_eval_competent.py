"""The competent scripted model (benchmarks/agent_eval/competent.py), over the real OpenAI wire
protocol: it finishes scenarios of every shape (a diagnosis, a comparison, a plan, an order) within
the eval's default budget, and, reading only the request body, never calls a mutating tool for a
question even when one is offered."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from trainops.benchmarks.agent_eval.competent import competent
from trainops.cli import app

SHAPES = ["crash-what-happened", "mfu-regression", "sop-checkpoint-interval", "sop-cancel-needs-approval"]


def test_a_competent_model_passes_within_the_default_budget_with_each_turn_s_prompt_reported():
    picked = [arg for name in SHAPES for arg in ("--scenario", name)]
    result = CliRunner().invoke(app, ["eval", "run", "--provider", "scripted", "--model", "competent", "--k", "1",
                                      "--json", *picked])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["overall"]["pass_hat_k"] == 1.0, [(s["scenario"], [c["name"] for c in s["checks"] if not c["passed"]])
                                                   for s in data["scores"] if not s["passed"]]
    for score in data["scores"]:
        assert score["stop_reason"] == "answered" and score["tokens"] < 60000
        assert 2 <= len(score["prompt_tokens_per_turn"]) <= 12
    assert 2000 < data["prompt_tokens_per_turn_median"] <= data["prompt_tokens_per_turn_max"]


def _tool(name: str, risk: str, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"[risk: {risk}] {name}.", "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in required}, "required": required}}}


def test_a_question_gets_read_calls_only_whatever_is_offered_and_the_same_body_the_same_reply():
    understood = ('# The request, as understood\nact: question; kind: diagnose; subject: job; entities (resolved '
                  'ids): {"jobs": ["j1"]}\n')
    body = {"messages": [{"role": "system", "content": understood}, {"role": "user", "content": "Why did j1 stop?"}],
            "tools": [_tool("cancel_job", "mutate, needs human approval", ["job_id"]),
                      _tool("job_status", "read", ["job_id"]), _tool("list_interruptions", "read", [])]}
    reply = competent(body)
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply["tool_calls"]]
    assert calls == [("job_status", {"job_id": "j1"})]
    assert competent(body) == reply
