"""The agent benchmark's budget in turns and tokens, and what each model turn costs: a scripted
OpenAI-protocol model (benchmarks/agent_eval/scripted.py, a real HTTP server as strict as
llama.cpp's about `content: null`) is stopped by either budget, and the results report the prompt
tokens of every turn, tool schemas included."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from typer.testing import CliRunner

from trainops.benchmarks.agent_eval import scripted
from trainops.cli import app

PLAIN = "crash-what-happened"


def eval_run(*args: str) -> dict:
    result = CliRunner().invoke(app, ["eval", "run", "--k", "1", "--json", "--scenario", PLAIN, *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_scripted_server_answers_500_to_content_null_as_llama_cpp_does():
    turn = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c0", "type": "function", "function": {"name": "list_jobs", "arguments": "{}"}}]}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}, turn,
                                       {"role": "tool", "tool_call_id": "c0", "content": "[]"}]}
    with scripted.ScriptedServer(scripted.looping) as server:
        request = urllib.request.Request(f"{server.base_url}/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=10)
        assert refused.value.code == 500
        turn["content"] = ""
        request.data = json.dumps(body).encode()
        with urllib.request.urlopen(request, timeout=10) as answered:
            assert json.loads(answered.read())["choices"][0]["message"]["tool_calls"]


@pytest.mark.parametrize("budget, stop", [(["--max-turns", "3"], "step_budget"),
                                          (["--max-tokens", "20000"], "token_budget")])
def test_a_looping_model_is_stopped_by_either_budget(budget, stop):
    result = eval_run("--provider", "scripted", "--model", "looping", *budget)
    [score] = result["scores"]
    assert score["stop_reason"] == stop and "within_budget" in [c["name"] for c in score["checks"]
                                                                if not c["passed"]]


def test_the_results_report_each_turn_s_prompt_tokens_with_the_tool_schemas_counted():
    result = eval_run("--provider", "scripted", "--model", "overconfident")
    [score] = result["scores"]
    turns = score["prompt_tokens_per_turn"]
    assert len(turns) >= 2 and turns == sorted(turns)  # the conversation grows turn by turn
    assert result["prompt_tokens_per_turn_max"] == max(turns) > 2000  # the schemas alone are thousands of tokens
    assert result["prompt_tokens_per_turn_mean"] > 0
