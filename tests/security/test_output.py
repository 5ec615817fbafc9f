"""Untrusted text is printed as text: through the real CLI, a `[conceal]` from a model, a tool,
a file or a user shows literally (it cannot hide part of an approval prompt) and a `[/]` does not
crash the command."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.agents.conftest import ScriptedOpenAI
from trainops.cli import app
from trainops.tools.governance import audit

runner = CliRunner()
HIDDEN = "[conceal]; rm -rf /data[/conceal]"


def _cli(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400"})  # wide: no line wrapping inside a checked line


@pytest.fixture
def model(monkeypatch, tmp_path):
    """A scripted OpenAI-compatible model on 127.0.0.1, chosen through the environment."""
    stub = ScriptedOpenAI()
    monkeypatch.setenv("TRAINOPS_CONFIG", str(tmp_path / "no-user-config.toml"))
    for var, value in {"TRAINOPS_PROVIDER": "openai", "TRAINOPS_MODEL": "scripted", "TRAINOPS_BASE_URL": stub.base_url,
                       "OPENAI_API_KEY": "test-key-not-secret"}.items():
        monkeypatch.setenv(var, value)
    yield stub
    stub.close()


def test_an_error_message_with_markup_prints_literally_instead_of_crashing():
    result = _cli("ablate", "--knob", "[/]=1")
    assert result.exit_code == 2 and "unknown knob '[/]'" in result.output
    result = _cli("ablate", "--knob", "[conceal]x[/conceal]=1")
    assert result.exit_code == 2 and "[conceal]x[/conceal]" in result.output


def test_the_approval_prompt_shows_a_models_concealed_arguments(model):
    model.script = [model.tool_call("set_tenant_quota", {"tenant": "acme", "gpus": 4, "priority": "low",
                                                         "reason": f"trial {HIDDEN}"}),
                    model.text("Waiting for your approval.")]
    result = _cli("ask", "give acme 4 GPUs")
    assert result.exit_code == 0, result.output
    prompt = result.output[result.output.index("approval needed"):]  # the call, one field per line below it
    assert "set_tenant_quota" in prompt.splitlines()[0] and HIDDEN in prompt


def test_a_model_answer_and_tool_arguments_with_a_stray_closing_tag_do_not_crash(model):
    model.script = [model.tool_call("list_jobs", {"scheduler": "local", "note": "[/]"}), model.text("done [/] [bold]")]
    result = _cli("ask", "list jobs")
    assert result.exit_code == 1 and "not an answer to rely on" in result.output, result.output  # free text
    assert "done [/] [bold]" in result.output and '"note": "[/]"' in result.output


def test_the_approvals_table_and_the_audit_log_show_poisoned_text_literally(workspace):
    quota = {"tenant": "acme", "gpus": 4, "priority": "low", "reason": f"trial {HIDDEN}"}
    _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(quota))
    listed = _cli("approvals")
    assert listed.exit_code == 0, listed.output
    assert "[conceal]" in listed.output and "rm -rf" in listed.output
    audit.append("tool_call", tool="[/]", actor=HIDDEN, ok=True)
    shown = _cli("audit", "show")
    assert shown.exit_code == 0, shown.output
    assert "[/]" in shown.output and "[conceal]" in shown.output


def test_a_threads_listing_shows_the_users_first_request_literally(model):
    model.script = [model.text("ok")]
    _cli("ask", f"please {HIDDEN}")
    listed = _cli("threads")
    assert listed.exit_code == 0, listed.output
    assert "[conceal]" in listed.output
