"""Attack 12: a call that can never run is never queued, so no human is asked to sign it. The
tenant id is matched in full by a strict pattern at the input model; the input is validated (a
model built without validation included) and the tool's checks run before the queue; and a
call whose token was spent but which then fails gives one clear error, not a traceback."""
from __future__ import annotations

import json

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import BaseModel, field_validator
from typer.testing import CliRunner

from trainops.agents.session import AgentSession
from trainops.cli import app
from trainops.tools.base import ToolError, tool
from trainops.tools.calls import call
from trainops.tools.catalog import build_registry
from trainops.tools.changes.quotas import QuotaInput
from trainops.tools.context import CallContext
from trainops.tools.governance import audit, queue

runner = CliRunner()
BAD_TENANTS = ["../../escape", "acme\n", "acme\u202e", "Acme Corp", "", "a" * 200, "-acme", ".."]


def quota(tenant: str, gpus: int = 8) -> dict:
    return {"tenant": tenant, "gpus": gpus, "priority": "high", "reason": "launch week"}


def nothing_queued() -> bool:
    return queue.pending_calls() == [] and not any(e.get("kind") == "queued" for e in audit.read())


@pytest.mark.parametrize("tenant", BAD_TENANTS)
def test_a_quota_change_for_a_bad_tenant_id_is_refused_at_the_cli_before_it_is_queued(tenant):
    result = runner.invoke(app, ["tool", "call", "set_tenant_quota", "--input", json.dumps(quota(tenant)), "--json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert "tenant" in error and "is not valid" in error and "pending approval" not in error
    assert nothing_queued()


@pytest.mark.parametrize("tenant", ["../../escape", "acme\n"])
def test_the_agent_s_bad_tenant_id_is_refused_before_it_is_queued(tenant):
    with pytest.raises(ToolError, match="tenant id .* is not valid") as info:
        call("set_tenant_quota", quota(tenant), CallContext(actor="agent"))
    assert getattr(info.value, "pending_id", None) is None
    assert nothing_queued()


def test_an_input_built_without_validation_is_validated_before_it_is_queued():
    sneaked = QuotaInput.model_construct(**quota("../../escape"))
    with pytest.raises(ToolError, match="tenant id .* is not valid"):
        call("set_tenant_quota", sneaked, CallContext(actor="agent"))
    assert nothing_queued()


def test_a_framework_upgrade_for_a_bad_tenant_id_is_refused_before_it_is_queued():
    upgrade = {"tenant": "../../escape", "framework": "torch", "from_version": "2.12.0", "to_version": "2.13.0"}
    result = runner.invoke(app, ["tool", "call", "upgrade_framework", "--input", json.dumps(upgrade), "--json"])
    assert result.exit_code == 2
    assert "tenant" in json.loads(result.stdout)["error"] and nothing_queued()


class DriftingInput(BaseModel):
    label: str

    @field_validator("label")
    @classmethod
    def _grows(cls, value: str) -> str:
        return value + "!"  # reads its own output back as another input: its approval could never match


class DriftingOutput(BaseModel):
    label: str


@tool("drifting_change", risk="mutate", approval_required=True)
def drifting_change(inp: DriftingInput) -> DriftingOutput:
    """A change whose input does not survive its own round trip."""
    return DriftingOutput(label=inp.label)


def test_an_input_that_does_not_read_back_as_itself_is_refused_before_it_is_queued():
    with pytest.raises(ToolError, match="drifting_change.*does not read back as itself"):
        call("drifting_change", {"label": "x"}, CallContext(actor="agent"),
             registry=build_registry(extra=[drifting_change]))
    assert nothing_queued()


class AsksBadQuota(BaseChatModel):
    """A model that asks to set a quota for tenant `../../escape` once, then answers."""
    def bind_tools(self, tools, **kwargs):
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        if any(isinstance(m, ToolMessage) for m in messages):
            reply = AIMessage(content="Refused.")
        else:
            reply = AIMessage(content="", tool_calls=[{"name": "set_tenant_quota", "args": quota("../../escape"),
                                                       "id": "q1"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def test_a_bad_tenant_in_the_agent_graph_comes_back_to_the_model_and_asks_no_human():
    with AgentSession("badquota", llm=AsksBadQuota()) as session:
        events = list(session.ask("give ../../escape 8 GPUs"))
        assert session.pending() == []
    assert [e["kind"] for e in events] == ["tool_call", "tool_result", "answer"]
    assert "tenant" in events[1]["output"]["error"] and nothing_queued()


def _approved_quota_token(approvers, tenant: str) -> tuple[dict, str]:
    inp = quota(tenant)
    result = runner.invoke(app, ["tool", "call", "set_tenant_quota", "--input", json.dumps(inp), "--json"])
    pending = json.loads(result.stdout)["error"].split("pending approval ")[1].split()[0]
    first = runner.invoke(app, ["approve", "--pending", pending, "--key", str(approvers.alice.key), "--json"])
    second = runner.invoke(app, ["approve", "--pending", pending, "--key", str(approvers.bob.key), "--cosign",
                                 json.loads(first.stdout)["token"], "--json"])
    assert second.exit_code == 0, second.output
    return inp, json.loads(second.stdout)["token"]


def test_a_spent_token_whose_call_then_fails_gives_one_clear_error_and_no_traceback(approvers, monkeypatch, tmp_path):
    inp, token = _approved_quota_token(approvers, "acme")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "no-such-slurm.conf"))  # no Slurm accounting to reach
    result = runner.invoke(app, ["tool", "call", "set_tenant_quota", "--input", json.dumps(inp),
                                 "--approval-token", token])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert "set_tenant_quota" in result.output and "no Slurm accounting reachable" in result.output
    assert "trainops sandbox up" in result.output and "no-such-slurm.conf" in result.output


@pytest.mark.parametrize("tool_name", ["cancel_job", "requeue_job"])
@pytest.mark.parametrize("scheduler", ["local", "slurm"])
def test_a_stop_or_relaunch_of_a_job_trainops_did_not_launch_is_refused_before_it_is_queued(tool_name, scheduler):
    """No human is asked to sign a cancel or a requeue of a job with no launch record here: the
    record is what makes it trainops' own, and the check runs before the queue."""
    result = runner.invoke(app, ["tool", "call", tool_name, "--input",
                                 json.dumps({"job_id": "424242", "scheduler": scheduler}), "--json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert "was not launched by trainops in this workspace" in error and "pending approval" not in error
    with pytest.raises(ToolError, match="was not launched by trainops in this workspace") as info:
        call(tool_name, {"job_id": "424242", "scheduler": scheduler}, CallContext(actor="agent"))
    assert getattr(info.value, "pending_id", None) is None
    assert nothing_queued()
