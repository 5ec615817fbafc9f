"""What trainops sends to an OpenAI-compatible server and how the server's failures read, against a
real HTTP server on 127.0.0.1 (tests/agents/conftest.py) that, like llama.cpp's, answers HTTP 500 to
an assistant message with tool calls and `content: null`."""
from __future__ import annotations

import pytest

from tests.agents.conftest import HttpReply, ScriptedOpenAI
from trainops.agents.providers import ProviderError
from trainops.agents.session import AgentSession
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.governance import queue

tool_call, text = ScriptedOpenAI.tool_call, ScriptedOpenAI.text
PLAN = {"save_s": 300, "restart_s": 60, "mtbf_h": 3}
KEY = "test-key-not-secret"  # the scripted_openai fixture's OPENAI_API_KEY


def _assistant_turns(request: dict) -> list[dict]:
    return [m for m in request["messages"] if m["role"] == "assistant"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_turn_goes_back_with_empty_content_never_null(scripted_openai, openai_settings, stream):
    scripted_openai.script = [tool_call("plan_checkpoint_interval", PLAN), text("Checkpoint every 39.2 min.")]
    with AgentSession("wire", openai_settings, stream_tokens=stream) as session:
        events = list(session.ask("plan the checkpoint interval"))
    assert events[-1] == {"kind": "answer", "text": "Checkpoint every 39.2 min."}
    assert len(scripted_openai.requests) == 2  # the second turn was not refused
    [turn] = _assistant_turns(scripted_openai.requests[1])
    assert turn["content"] == "" and turn["tool_calls"][0]["function"]["name"] == "plan_checkpoint_interval"


def test_tool_choice_auto_goes_with_every_request_that_offers_tools(scripted_openai, openai_settings):
    scripted_openai.script = [tool_call("plan_checkpoint_interval", PLAN), text("Done.")]
    with AgentSession("wire", openai_settings) as session:
        list(session.ask("plan the checkpoint interval"))
    assert [(bool(r.get("tools")), r.get("tool_choice")) for r in scripted_openai.requests] == [(True, "auto")] * 2


def _fails(scripted_openai, settings, reply: HttpReply) -> str:
    scripted_openai.script = [reply]
    with AgentSession("err", settings) as session:
        with pytest.raises(ProviderError) as caught:
            list(session.ask("hello"))
    return str(caught.value)


def test_a_timeout_says_timed_out_and_the_setting_not_cannot_reach(scripted_openai, openai_settings):
    settings = openai_settings.model_copy(update={"timeout_s": 0.5})
    message = _fails(scripted_openai, settings, HttpReply(delay_s=2.0, body=text("too late")))
    assert message.startswith(f"the openai endpoint at base_url={scripted_openai.base_url} did not answer within "
                              "timeout_s=0.5 s")
    assert "cannot reach" not in message and "timeout_s" in message


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_names_the_status_and_the_variable_and_never_shows_the_key(scripted_openai, openai_settings,
                                                                                  status):
    body = {"error": {"message": f"Incorrect API key provided: {KEY}. Authorization: Bearer "
                                 f"{'b' * 40}; api_key=sk-proj-{'x' * 30}", "type": "invalid_request_error"}}
    message = _fails(scripted_openai, openai_settings, HttpReply(status, body))
    assert message.startswith(f"the openai endpoint refused the API key in OPENAI_API_KEY (HTTP {status})")
    assert KEY not in message and "b" * 20 not in message and "x" * 20 not in message


def test_a_server_error_names_the_status_and_shows_a_short_redacted_body(scripted_openai, openai_settings):
    secret = "tok-" + "s" * 40
    body = {"error": {"message": f"CUDA out of memory while loading; headers: {{'Authorization': 'Bearer {secret}', "
                                 f"'token': '{secret}'}} " + "trace " * 400}}
    message = _fails(scripted_openai, openai_settings, HttpReply(503, body))
    assert message.startswith(f"the openai endpoint at base_url={scripted_openai.base_url} answered with a server "
                              "error (HTTP 503)")
    assert "CUDA out of memory" in message and secret not in message and "s" * 20 not in message
    assert "…" in message and len(message) < 700  # the body is cut at 300 characters


def test_an_unreachable_endpoint_is_not_a_timeout(monkeypatch, openai_settings):
    settings = openai_settings.model_copy(update={"base_url": "http://127.0.0.1:1/v1"})
    with AgentSession("down", settings) as session, pytest.raises(ProviderError) as caught:
        list(session.ask("hello"))
    assert str(caught.value).startswith("cannot reach the openai endpoint at base_url=http://127.0.0.1:1/v1")
    assert "did not answer within" not in str(caught.value)


def test_an_empty_drain_from_the_model_is_refused_naming_the_field_and_nothing_is_queued(scripted_openai,
                                                                                         openai_settings):
    scripted_openai.script = [tool_call("drain_node", {"node": ""}), text("Could not drain.")]
    with AgentSession("drain", openai_settings) as session:
        events = list(session.ask("drain it"))
    [result] = [e for e in events if e["kind"] == "tool_result"]
    assert result["status"] == "error" and result["output"]["error"].startswith("invalid input for drain_node: "
                                                                               "('node',)")
    assert queue.pending_calls() == []


def test_an_empty_node_is_refused_by_the_tool_itself_naming_the_field():
    for tool in ("drain_node", "resume_node"):
        with pytest.raises(ToolError, match="node"):
            call(tool, {"node": ""})
