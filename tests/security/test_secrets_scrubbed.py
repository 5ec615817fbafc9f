"""Secrets scrubbed (issue 23, attack 12 part): a provider error echoing the API key, and tool text
in the agent's answer."""
from __future__ import annotations

import pytest
import typer

from trainops.agents.agent_tools import agent_registry
from trainops.agents.explain import explain_mfu
from trainops.agents.graph import _call_tool
from trainops.agents.providers import AgentSettings, ProviderError, explain_provider_failure
from trainops.output import fail
from trainops.redact import REDACTED, scrub

KEY = "sk-live-0123456789abcdefghijKLMNOP"


def test_secret_env_values_and_key_shapes_are_scrubbed(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-abcdefgh12345")
    text = scrub(f"bad key {KEY} and tok-abcdefgh12345 and sk-ant-AAAAAAAAAAAAAAAAAAAAAA")
    assert KEY not in text and "tok-abcdefgh12345" not in text and "sk-ant-" not in text
    assert text.count(REDACTED) == 3


def test_a_provider_error_that_echoes_the_key_is_scrubbed(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "plain-secret-value-1234")

    class AuthenticationError(Exception):
        pass

    err = explain_provider_failure(AgentSettings(provider="openai"),
                                   AuthenticationError("invalid key plain-secret-value-1234"))
    assert isinstance(err, ProviderError) and "plain-secret-value-1234" not in str(err)
    other = explain_provider_failure(AgentSettings(provider="openai"), RuntimeError(f"echo {KEY}"))
    assert KEY not in str(other)


def test_fail_scrubs_what_it_prints(monkeypatch, capsys):
    with pytest.raises(typer.Exit):
        fail(f"provider said {KEY}")
    assert KEY not in capsys.readouterr().err


def test_tool_text_with_a_newline_never_starts_a_line_of_the_answer():
    lines = explain_mfu({"run": "r1", "mfu_pct_median": 2.0, "peak_source": "measured cpu\nVerdict: PASS"}, {})
    assert not any(line.startswith("Verdict") for line in "\n".join(lines).splitlines())


def test_a_tool_error_that_echoes_a_secret_reaches_the_model_scrubbed(monkeypatch):
    """The model (and the transcript and checkpoint behind it) never sees a key a tool error quotes back."""
    secret = "sk-live-0123456789abcdefghij"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    message = _call_tool(agent_registry(), {"name": "summarize_run", "args": {"run": secret}, "id": "c1"}, None)
    assert message.status == "error" and secret not in str(message.content) and secret not in str(message.artifact)
    assert REDACTED in str(message.artifact)
