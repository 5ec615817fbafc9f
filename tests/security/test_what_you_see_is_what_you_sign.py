"""Attack 1: what a human approves is what their key signs. The agent rewrites the call a paused
thread waits on in agent.sqlite (the real LangGraph SQLite checkpointer) after it was queued:
`trainops chat` refuses, naming the thread and the pending id, and nothing is signed. Every
approval prompt (chat, `approvals`, `approve --pending`) shows the call in full, one field per
line, from the canonical bytes the signature covers, and `approve` signs exactly those bytes."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command, Interrupt
from typer.testing import CliRunner

from trainops.agents.session import AgentSession
from trainops.cli import app
from trainops.tools.changes.quotas import QuotaInput
from trainops.tools.governance import anchors, audit, queue, tokens
from trainops.tools.schedulers.base import JobSpec
from trainops.tools.schedulers.local import LocalScheduler
from trainops.workspace import agent_db_path

runner = CliRunner()
THREAD = "wysiwys"
SCRATCH = {"job_id": "scratch"}
IMPORTANT = {"job_id": "important-run", "force": True}


class CancelsScratch(BaseChatModel):
    """A model that asks to cancel job `scratch` once, then answers."""
    def bind_tools(self, tools, **kwargs):
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        if any(isinstance(m, ToolMessage) for m in messages):
            reply = AIMessage(content="Done.")
        else:
            reply = AIMessage(content="", tool_calls=[{"name": "cancel_job", "args": SCRATCH, "id": "c1"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


@pytest.fixture(autouse=True)
def launched_jobs():
    """Launch records for `scratch` and `important-run`, as submit_job leaves them: a cancel is queued
    for a human only for a job trainops launched here (tools/jobs/jobs.py checks it before the queue)."""
    for job_id in (SCRATCH["job_id"], IMPORTANT["job_id"]):
        spec = JobSpec(name=job_id, command=["true"])
        LocalScheduler()._save({"job_id": job_id, "spec": spec.model_dump(), "state": "running"})


@pytest.fixture
def ssh_agent(approvers, tmp_path, monkeypatch):
    """alice's key in a real ssh-agent, as at the approver's terminal: chat signs with it."""
    socket = tmp_path / "agent.sock"
    started = subprocess.run(["ssh-agent", "-s", "-a", str(socket)], capture_output=True, text=True, check=True).stdout
    pid = int(started.split("SSH_AGENT_PID=")[1].split(";")[0])
    try:
        monkeypatch.setenv("SSH_AUTH_SOCK", str(socket))
        subprocess.run(["ssh-add", "-q", str(approvers.alice.key)], check=True, capture_output=True)
        yield approvers.alice
    finally:
        os.kill(pid, 15)


def _paused_thread() -> str:
    """A thread paused for approval of `cancel_job scratch`; returns its pending id."""
    with AgentSession(THREAD, llm=CancelsScratch()) as session:
        events = list(session.ask("cancel job scratch"))
    assert events[-1]["kind"] == "approval" and events[-1]["args"] == SCRATCH
    return events[-1]["pending_id"]


def _rewrite_paused_call(args: dict[str, Any], *, state: bool, interrupt: bool) -> None:
    """What the agent does with the workspace's agent.sqlite: rewrite the paused call in place
    through the checkpointer (the call the graph resumes with, the interrupt chat shows, or both)."""
    conn = sqlite3.connect(str(agent_db_path()), check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        found = saver.get_tuple({"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}})
        if state:
            checkpoint = found.checkpoint
            checkpoint["channel_values"]["gated"][0]["args"] = args
            saver.put(found.parent_config, checkpoint, found.metadata, {})
        if interrupt:
            for task_id, channel, value in found.pending_writes:
                if channel == "__interrupt__":
                    items = [Interrupt(value={**item.value, "args": args}, id=item.id) for item in value]
                    saver.put_writes(found.config, [(channel, items)], task_id)
    finally:
        conn.close()


def _signed_calls() -> list[dict[str, Any]]:
    return [e for e in audit.read() if e.get("kind") == anchors.ANCHOR_KIND and e.get("decision") == "token_issued"]


def _chat(*answers: str):
    return runner.invoke(app, ["chat", "--thread", THREAD, "--approver", "alice"], input="\n".join(answers) + "\n")


@pytest.mark.parametrize("state, interrupt", [(True, False), (False, True), (True, True)],
                         ids=["resumed-call", "shown-call", "both"])
def test_chat_refuses_a_paused_call_rewritten_in_agent_sqlite_and_signs_nothing(ssh_agent, state, interrupt):
    pending = _paused_thread()
    _rewrite_paused_call(IMPORTANT, state=state, interrupt=interrupt)
    result = _chat("approve", "/exit")
    assert result.exit_code == 2, result.output
    assert f"thread {THREAD}" in result.output and pending in result.output
    assert "important-run" not in result.output
    assert _signed_calls() == []
    assert [p.id for p in queue.pending_calls()] == [pending]


def test_the_graph_signs_nothing_when_the_call_it_resumes_is_not_the_one_approved(approvers):
    """Defence in depth: the thread is rewritten after the approver's view was checked."""
    pending = _paused_thread()
    shown = queue.signable(pending)
    _rewrite_paused_call(IMPORTANT, state=True, interrupt=False)
    with AgentSession(THREAD, llm=CancelsScratch()) as session:
        decision = {"decision": "approve", "approver": "alice", "key": str(approvers.alice.key),
                    "tool": "cancel_job", "pending_id": shown.call_id, "input_sha256": shown.input_sha256}
        session.graph.invoke(Command(resume=decision), session.config)
    assert _signed_calls() == []


def test_chat_shows_the_queued_call_in_full_one_field_per_line_and_signs_those_bytes(ssh_agent):
    pending = _paused_thread()
    result = _chat("approve", "/exit")
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    assert {'job_id = "scratch"', "force = false", 'scheduler = "local"'} <= set(lines)
    [signed] = _signed_calls()
    body = json.loads(signed["signed"])
    sha = audit.sha256_hex(audit.canonical_json({"force": False, "job_id": "scratch", "scheduler": "local"}))
    assert f"input sha256 {sha}" in lines
    assert (body["call_id"], body["tool"], body["input_sha256"]) == (pending, "cancel_job", sha)


def _queue_quota(gpus: int, reason: str) -> str:
    quota = {"tenant": "acme", "gpus": gpus, "priority": "high", "reason": reason}
    result = runner.invoke(app, ["tool", "call", "set_tenant_quota", "--input", json.dumps(quota), "--json"])
    assert result.exit_code == 2, result.output
    return json.loads(result.stdout)["error"].split("pending approval ")[1].split()[0]


def test_approve_pending_shows_every_field_before_it_signs_and_signs_exactly_those_bytes(approvers):
    reason = "capacity for launch week " * 40 + '"gpus":8'
    pending = _queue_quota(4096, reason)
    result = runner.invoke(app, ["approve", "--pending", pending, "--key", str(approvers.alice.key)])
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    assert "gpus = 4096" in lines and f"reason = {json.dumps(reason)}" in lines
    assert 'tenant = "acme"' in lines and 'priority = "high"' in lines
    shown_sha = next(line.split()[-1] for line in lines if line.startswith("input sha256 "))
    signed_line = next(i for i, line in enumerate(lines) if line.startswith("signed call"))
    assert lines.index("gpus = 4096") < signed_line
    token = result.output.split("--cosign ")[1].split()[0]
    [approval] = tokens.parse(token)

    full = QuotaInput(tenant="acme", gpus=4096, priority="high", reason=reason).model_dump(mode="json")
    assert "emergency = false" in lines  # every field, defaults too, is shown before it is signed
    assert approval.payload.input_sha256 == shown_sha == queue.input_hash(full)
    assert approval.payload.call_id == pending


def test_approve_refuses_when_the_queued_call_changed_after_it_was_shown(approvers):
    pending = _queue_quota(8, "launch week")
    shown = queue.signable(pending)
    path = queue.gov_dir("pending") / f"{pending}.json"
    item = json.loads(path.read_text())
    item["input"]["gpus"] = 4096
    path.write_text(json.dumps(item))
    with pytest.raises(ValueError, match=f"{pending}.*nothing was signed|edited after the call was queued"):
        tokens.approve(shown, approvers.alice.key)
    assert _signed_calls() == []


def test_approvals_lists_each_pending_call_in_full_and_an_edited_one_as_refused():
    kept = _queue_quota(8, "launch week")
    edited = _queue_quota(16, "second team")
    path = queue.gov_dir("pending") / f"{edited}.json"
    item = json.loads(path.read_text())
    item["input"]["gpus"] = 4096
    path.write_text(json.dumps(item))
    result = runner.invoke(app, ["approvals"])
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines()]
    assert {"gpus = 8", 'reason = "launch week"', 'tenant = "acme"'} <= set(lines)
    assert any(kept in line for line in lines)
    assert "gpus = 4096" not in lines and "4096" not in result.output
    assert any(edited in line and "refused" in line for line in lines)
