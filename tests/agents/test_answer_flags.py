"""An answer that cannot stand as one (empty, free text instead of the structured final_answer, or
cut off at the model's output limit) is flagged: `trainops ask --json` exits non-zero with the
flag, and the agent benchmark's trace carries it (its scoring fails the scenario). Against a real
HTTP server speaking the OpenAI protocol (tests/agents/conftest.py)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.agents.conftest import ScriptedOpenAI
from trainops.benchmarks.agent_eval.agent_run import run_agent
from trainops.cli import app

tool_call, text = ScriptedOpenAI.tool_call, ScriptedOpenAI.text
PLAN = {"save_s": 300, "restart_s": 60, "mtbf_h": 3}
STRUCTURED = {"verdict": "answered", "confidence": "low", "summary": "Checkpoint every 39.2 min (Daly)."}


def ask_json(scripted_openai, thread: str):
    result = CliRunner().invoke(app, ["ask", "plan the checkpoint interval", "--json", "--thread", thread,
                                      "--provider", "openai", "--model", "scripted",
                                      "--base-url", scripted_openai.base_url])
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("last, flag", [
    (text("Checkpoint every 39.2 min."), "free_text"),
    (text("Checkpoint every 39.2 min, because the Daly formula with a save of", finish_reason="length"), "truncated"),
    (text(""), "empty"),
])
def test_ask_json_exits_non_zero_on_an_answer_that_cannot_stand(scripted_openai, last, flag):
    scripted_openai.script = [tool_call("plan_checkpoint_interval", PLAN), last]
    code, out = ask_json(scripted_openai, f"flag-{flag}")
    assert code == 1
    assert out["answer_flag"] == flag and out["stop_reason"] == "answered"
    assert out["tool_calls"] == [{"tool": "plan_checkpoint_interval", "status": "success"}]


def test_ask_json_exits_zero_on_a_checked_structured_answer(scripted_openai):
    scripted_openai.script = [tool_call("plan_checkpoint_interval", PLAN),
                              tool_call("final_answer", STRUCTURED, "call_final")]
    code, out = ask_json(scripted_openai, "flag-none")
    assert code == 0 and out["answer_flag"] is None
    assert out["final_answer"]["summary"] == STRUCTURED["summary"]


def test_the_offline_policy_s_text_answer_is_not_flagged():
    result = CliRunner().invoke(app, ["ask", "plan the checkpoint interval for a 5-minute save and an MTBF of 3 hours",
                                      "--json", "--thread", "flag-offline"])
    assert result.exit_code == 0 and json.loads(result.stdout)["answer_flag"] is None


def test_the_benchmark_trace_carries_the_flag_and_per_turn_prompt_tokens(scripted_openai, openai_settings):
    scripted_openai.script = [tool_call("plan_checkpoint_interval", PLAN), text("Every 39 min.", "length")]
    trace = run_agent("plan the checkpoint interval", settings=openai_settings)
    assert trace.answer_flag == "truncated"
    assert trace.prompt_tokens_per_turn == [1, 1]  # the scripted server reports 1 prompt token a turn


@pytest.mark.parametrize("variable, value, stop", [("TRAINOPS_MAX_TURNS", "2", "step_budget"),
                                                   ("TRAINOPS_MAX_TOKENS", "3", "token_budget")])
def test_a_budget_from_the_settings_stops_ask_and_it_exits_non_zero(scripted_openai, monkeypatch, variable, value,
                                                                     stop):
    monkeypatch.setenv(variable, value)  # the scripted server reports 2 tokens a turn
    scripted_openai.script = [tool_call("list_jobs", {}, f"c{i}") for i in range(5)]
    code, out = ask_json(scripted_openai, f"budget-{stop.replace('_', '-')}")
    assert code == 1 and out["stop_reason"] == stop and len(scripted_openai.requests) == 2
