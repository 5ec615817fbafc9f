"""One gate, actor-aware, for every path a tool can be called through (issue 13 item 2).

The attacker is the agent: it holds `as_langchain_tools()`, the Python registry, or a skill, and
tries to change the world (cancel a job, start one, move checkpoints) without a human. Every
path must stop at the gate; a human's token, or the operator at the CLI, lets the call through.
Real local jobs, the real gate and audit log; no mocks."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

import trainops.skills
from trainops.agents.agent_tools import agent_registry
from trainops.cli import app
from trainops.tools.base import tool
from trainops.tools.calls import call
from trainops.tools.catalog import build_registry, tool_registry
from trainops.tools.context import CallContext, serving
from trainops.tools.governance import audit, queue, tokens
from trainops.tools.governance.gate import GateRefused
from trainops.tools.langchain import as_langchain_tools
from trainops.tools.schedulers import get_scheduler
from trainops.trainer.checkpoint_files import COMMIT_FILE, step_dir_name

OPERATOR = CallContext(actor="operator")
SLEEPER = {"spec": {"name": "sleeper", "launcher": "plain",
                    "command": [sys.executable, "-c", "import time; time.sleep(120)"]}}


def state(job_id: str) -> str:
    return call("job_status", {"job_id": job_id}, OPERATOR).state


@pytest.fixture
def sleeper(workspace):
    """A real local job the operator started, that an agent must not be able to stop on its own."""
    job_id = call("submit_job", SLEEPER, OPERATOR).handle.job_id
    deadline = time.monotonic() + 20
    while state(job_id) != "running":
        assert time.monotonic() < deadline, "the stand-in job never started"
        time.sleep(0.05)
    yield job_id

    local = get_scheduler("local")  # clean-up straight at the backend: a test may have set a stricter policy
    if local.status(job_id).state == "running":
        local.cancel(job_id, True)


def human_token(approvers, tool_name: str, inp: dict, registry=None) -> str:
    """The agent's call queued, then approved with alice's own key, as `trainops approve --pending` does."""
    registry = registry or tool_registry()
    with serving(lambda: registry):
        item = queue.record_pending(tool_name, registry.spec(tool_name).Input.model_validate(inp), "agent")
        return tokens.approve(item.id, key=approvers.alice.key)


def gate_entries(tool_name: str) -> list[dict]:
    return [e for e in audit.read() if e.get("kind") == "gate" and e.get("tool") == tool_name]


def langchain_tool(name: str, ctx_factory=None):
    (lc,) = as_langchain_tools([name], **({"ctx_factory": ctx_factory} if ctx_factory else {}))
    return lc


# --- the agent's paths: LangChain tools, the Python registry, a skill -------------------------------


def test_a_langchain_cancel_job_without_a_token_is_refused_and_the_job_keeps_running(sleeper):
    answer = langchain_tool("cancel_job").invoke({"job_id": sleeper})
    assert isinstance(answer, str) and "needs a human approval" in answer and "missing_token" in answer
    assert state(sleeper) == "running"
    [pending] = queue.pending_calls()
    assert (pending.tool, pending.input["job_id"], pending.requested_by) == ("cancel_job", sleeper, "agent")


def test_a_langchain_submit_job_without_a_token_starts_nothing(workspace):
    answer = langchain_tool("submit_job").invoke(SLEEPER)
    assert "needs a human approval" in answer
    assert call("list_jobs", {}, OPERATOR).jobs == []


def test_a_langchain_inject_fault_without_a_token_is_refused():
    answer = langchain_tool("inject_fault").invoke({"kind": "nan", "rank": 0, "step": 3})
    assert "needs a human approval" in answer
    assert gate_entries("inject_fault")[-1]["decision"] == "refused"


def test_a_langchain_context_cannot_claim_to_be_the_operator(sleeper):
    answer = langchain_tool("cancel_job", ctx_factory=lambda: OPERATOR).invoke({"job_id": sleeper})
    assert "LangChain tools serve a model" in answer
    assert state(sleeper) == "running"


def test_a_python_call_that_names_no_actor_is_the_agent_and_is_refused(sleeper):
    with pytest.raises(GateRefused) as refused:
        call("cancel_job", {"job_id": sleeper})
    assert (refused.value.reason, refused.value.rule_id) == ("missing_token", "R-SEC-4")
    assert gate_entries("cancel_job")[-1]["actor"] == "agent"
    assert state(sleeper) == "running"


def test_the_agents_own_mutating_tool_is_refused_before_it_runs_anything(workspace):
    with pytest.raises(GateRefused, match="needs a human approval"):
        call("sop_declare", {"quick": True}, registry=agent_registry())
    assert not any((workspace / "runs").glob("*"))


def test_a_human_token_lets_the_agent_cancel_that_job_once(sleeper, approvers):
    inp = {"job_id": sleeper}
    token = human_token(approvers, "cancel_job", inp)
    cancel = langchain_tool("cancel_job", ctx_factory=lambda: CallContext(actor="agent", approval_token=token))
    assert cancel.invoke(inp)["state"] == "cancelled"
    assert gate_entries("cancel_job")[-1]["approver"] == "alice"
    assert "replayed" in cancel.invoke(inp)


# --- skills act through tools, for whoever ran them ---------------------------------------------------


def committed_checkpoint(workspace, run: str, step: int):
    folder = workspace / "runs" / run / "checkpoints" / step_dir_name(step)
    folder.mkdir(parents=True)
    (folder / COMMIT_FILE).write_text(json.dumps({"step": step, "time": time.time(), "files": {}}))
    return folder


def test_an_sdc_response_step_for_the_agent_cannot_quarantine_checkpoints_without_a_token(workspace):
    kept = committed_checkpoint(workspace, "r1", 5)
    with pytest.raises(GateRefused, match="skill:sdc-response for agent needs a human approval"):
        call("quarantine_checkpoints", {"run": str(workspace / "runs" / "r1"), "from_step": 0},
             CallContext(actor="agent").for_skill("sdc-response"))
    assert kept.is_dir()


def test_an_sdc_response_for_the_operator_quarantines_through_the_gate_and_the_audit_log(workspace):
    committed_checkpoint(workspace, "r1", 5)
    older = committed_checkpoint(workspace, "r1", 2)
    moved = call("quarantine_checkpoints", {"run": str(workspace / "runs" / "r1"), "from_step": 4},
                 OPERATOR.for_skill("sdc-response")).quarantined_steps
    assert moved == [5] and older.is_dir()
    assert (workspace / "runs" / "r1" / "quarantine" / "step-00000005").is_dir()
    [outcome] = [e for e in audit.read() if e.get("kind") == "tool_call" and e.get("tool") == "quarantine_checkpoints"]
    assert outcome["actor"] == "skill:sdc-response for operator" and outcome["ok"]


def test_skills_do_not_move_delete_or_signal_anything_themselves():
    """Every world-changing step of a skill is a tool call (so it is gated and audited)."""
    forbidden = ("shutil.", "os.kill", "os.remove", ".unlink(", "rmtree", "signal.", "subprocess", "os.replace")
    root = Path(trainops.skills.__file__).parent
    found = [f"{path.relative_to(root)}: {word}" for path in root.rglob("*.py")
             for word in forbidden if word in path.read_text(encoding="utf-8")]
    assert found == []


# --- the stricter actor wins; an approval covers the steps of the call it approved ------------------


class ProbeInput(BaseModel):
    job_id: str


class ProbeOutput(BaseModel):
    state: str


def probe_registry(risk: str, claimed: CallContext | None):
    """A tool (declared in the test) whose body cancels a job: what an agent-callable tool that
    runs a skill looks like from the gate's side."""
    @tool("probe_cancel", risk=risk)
    def probe_cancel(inp: ProbeInput) -> ProbeOutput:
        """Cancel a job from inside another tool's call, claiming `claimed` as the caller."""
        return ProbeOutput(state=call("cancel_job", {"job_id": inp.job_id, "force": True}, claimed).state)

    return build_registry(extra=[probe_cancel])


def test_a_call_inside_an_agents_call_cannot_claim_to_be_the_operator(sleeper):
    with pytest.raises(GateRefused, match="cancel_job called by agent needs a human approval"):
        call("probe_cancel", {"job_id": sleeper}, CallContext(actor="agent"), registry=probe_registry("read", OPERATOR))
    assert state(sleeper) == "running"


def test_a_skill_inside_an_agents_call_acts_for_the_agent_whoever_it_claims(sleeper):
    with pytest.raises(GateRefused, match="skill:fault-drill for agent"):
        call("probe_cancel", {"job_id": sleeper}, registry=probe_registry("read", OPERATOR.for_skill("fault-drill")))
    assert state(sleeper) == "running"


def test_a_human_approved_call_covers_its_own_mutating_steps(sleeper, approvers):
    registry = probe_registry("mutate", None)
    token = human_token(approvers, "probe_cancel", {"job_id": sleeper}, registry)
    out = call("probe_cancel", {"job_id": sleeper}, CallContext(actor="agent", approval_token=token), registry=registry)
    assert out.state == "cancelled"
    assert gate_entries("cancel_job")[-1]["under_approved_call"] == tokens.call_id("probe_cancel", {"job_id": sleeper})


def test_an_approval_does_not_cover_an_approval_gated_step_inside_it(approvers):
    @tool("probe_quota", risk="mutate")
    def probe_quota(inp: ProbeInput) -> ProbeOutput:
        """Change a tenant's quota from inside another call."""
        call("set_tenant_quota", {"tenant": "acme", "gpus": 16, "priority": "high", "reason": "probe"})
        return ProbeOutput(state="changed")

    registry = build_registry(extra=[probe_quota])
    token = human_token(approvers, "probe_quota", {"job_id": "x"}, registry)
    with pytest.raises(GateRefused, match="set_tenant_quota"):
        call("probe_quota", {"job_id": "x"}, CallContext(actor="agent", approval_token=token), registry=registry)


# --- who may be named as the actor ------------------------------------------------------------------


@pytest.mark.parametrize("actor", ["root", "cli", "Operator", "skill:", "agent\n"])
def test_an_actor_that_is_not_operator_agent_or_a_skill_is_refused_naming_the_field(actor):
    with pytest.raises(ValueError, match=r"CallContext.actor=.* is not valid: use 'operator'"):
        CallContext(actor=actor)


def test_a_skill_must_say_on_whose_behalf_it_acts():
    with pytest.raises(ValueError, match="on_behalf_of"):
        CallContext(actor="skill:fault-drill")


# --- the operator at the CLI, and hosts where operators need approval too -------------------------------

runner = CliRunner()


def cli_cancel(job_id: str):
    return runner.invoke(app, ["tool", "call", "cancel_job", "--input", json.dumps({"job_id": job_id}), "--json"])


def test_the_operator_at_the_cli_cancels_without_a_token(sleeper):
    result = cli_cancel(sleeper)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["state"] == "cancelled"
    assert [e["actor"] for e in audit.read() if e.get("tool") == "cancel_job"][-1] == "operator"


def user_config(tmp_path, monkeypatch, text: str):
    config = tmp_path / "user-config.toml"
    config.write_text(text)
    monkeypatch.setenv("TRAINOPS_CONFIG", str(config))


def test_operator_needs_approval_makes_cli_calls_wait_for_a_human(sleeper, tmp_path, monkeypatch):
    user_config(tmp_path, monkeypatch, "[governance]\noperator_needs_approval = true\n")
    result = cli_cancel(sleeper)
    assert result.exit_code == 2 and "cancel_job called by operator needs a human approval" in result.output
    assert state(sleeper) == "running"


def test_a_project_local_settings_file_cannot_switch_operator_approval_off(sleeper, tmp_path, monkeypatch):
    user_config(tmp_path, monkeypatch, "[governance]\noperator_needs_approval = true\n")
    project = tmp_path / "cloned-repo"
    project.mkdir()
    (project / "trainops.toml").write_text("[governance]\noperator_needs_approval = false\n")
    monkeypatch.chdir(project)
    assert cli_cancel(sleeper).exit_code == 2
    assert state(sleeper) == "running"


def test_a_non_boolean_operator_approval_setting_is_an_error_naming_it(sleeper, tmp_path, monkeypatch):
    user_config(tmp_path, monkeypatch, '[governance]\noperator_needs_approval = "yes"\n')
    with pytest.raises(ValueError, match="operator_needs_approval in .* is 'yes': write true or false"):
        call("cancel_job", {"job_id": sleeper}, OPERATOR)


def test_a_queued_call_of_the_agents_own_tool_can_be_approved_at_the_cli(approvers, workspace):
    """`trainops approve` knows sop_declare because every command serves the registry the agent uses."""
    with pytest.raises(GateRefused) as refused:
        call("sop_declare", {"quick": True}, registry=agent_registry())
    result = runner.invoke(app, ["approve", "--pending", refused.value.pending_id, "--key", str(approvers.alice.key),
                                 "--json"])
    assert result.exit_code == 0, result.output
    token = json.loads(result.stdout)["token"]
    assert tokens.decode(token)["tool"] == "sop_declare"


def test_tool_list_says_whose_calls_wait_for_a_human(tmp_path, monkeypatch):
    def approval_for() -> dict[str, list[str]]:
        result = runner.invoke(app, ["tool", "list", "--json"])
        return {row["name"]: row["approval_for"] for row in json.loads(result.stdout)}

    listed = approval_for()
    assert listed["plan_layout"] == [] and listed["cancel_job"] == ["agent"]
    assert listed["set_tenant_quota"] == ["agent", "operator"]
    user_config(tmp_path, monkeypatch, "[governance]\noperator_needs_approval = true\n")
    assert approval_for()["cancel_job"] == ["agent", "operator"]
