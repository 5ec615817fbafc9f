"""The audit log fails closed: a mutating call acts only once its intent is on disk, a torn last
line stops every audited call until a person repairs it explicitly, and `audit verify` treats a
missing log or head file as broken, not as a clean slate."""
from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.governance import audit, queue, verification
from trainops.tools.governance.gate import GateRefused

runner = CliRunner()
DRAIN = {"scheduler": "local", "node": socket.gethostname(), "reason": "drill"}
OPERATOR = CallContext(actor="operator")  # a human at the CLI: the gate lets a mutating call on without a token


def _drain() -> None:
    call("drain_node", DRAIN, OPERATOR)


def _drained() -> bool:
    [node] = call("list_nodes", {"scheduler": "local"}, OPERATOR).nodes
    return node.state == "drained"


def _tear(workspace) -> None:
    """Leave the log as a crash mid-write does: half an entry, no newline."""
    audit.append("tool_call", tool="before-the-crash", ok=True)
    with open(workspace / "audit.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"seq": 2, "kind": "tool_call", "tool": "half-writ')


def test_a_mutating_call_writes_its_intent_before_acting_and_its_outcome_after(workspace):
    _drain()
    intent, outcome = [e for e in audit.read() if e.get("tool") == "drain_node"]
    assert (intent["kind"], outcome["kind"]) == ("intent", "tool_call")
    assert intent["seq"] < outcome["seq"] and outcome["intent"] == intent["hash"]
    assert intent["input"]["node"] == DRAIN["node"] and outcome["ok"] is True
    assert verification.verify().ok


def test_a_torn_last_line_refuses_a_mutating_call_before_it_acts(workspace):
    _tear(workspace)
    with pytest.raises(GateRefused, match=r"audit_unavailable.*line 2 is torn.*trainops audit repair") as refused:
        _drain()
    assert refused.value.rule_id == "R-SEC-5"
    with pytest.raises(GateRefused, match="torn"):
        _drained()  # a read is refused too: its audit entry could not be written either
    (workspace / "audit.jsonl").write_text("")
    assert not _drained()


def test_a_torn_log_refuses_an_agents_call_before_it_is_queued(workspace):
    _tear(workspace)
    with pytest.raises(GateRefused, match=r"audit_unavailable.*line 2 is torn"):
        call("drain_node", DRAIN, CallContext(actor="agent"))
    assert queue.pending_calls() == []


def test_an_unwritable_log_refuses_a_mutating_call(workspace):
    (workspace / "audit.jsonl").mkdir(parents=True)  # root ignores file modes; a folder in its place cannot be opened
    with pytest.raises(GateRefused, match=r"audit_unavailable.*audit log .* is not a regular file"):
        _drain()


def test_verify_names_the_torn_line_and_appending_after_it_is_refused(workspace):
    _tear(workspace)
    report = verification.verify()
    assert (report.ok, report.first_bad_line) == (False, 2) and "torn" in report.reason
    with pytest.raises(audit.AuditUnavailable, match="line 2 is torn"):
        audit.append("tool_call", tool="after")
    result = runner.invoke(app, ["audit", "show"])
    assert result.exit_code == 2 and "line 2 is not a JSON entry" in result.output and "Traceback" not in result.output


def test_repair_keeps_the_torn_bytes_in_a_side_file_and_audits_itself(workspace):
    _tear(workspace)
    result = runner.invoke(app, ["audit", "repair", "--json"])
    assert result.exit_code == 0, result.output
    entry = json.loads(result.output)
    assert (entry["kind"], entry["torn_line"], entry["seq"]) == ("audit_repair", 2, 2)
    side = workspace / entry["side_file"]
    assert side.read_bytes().startswith(b'{"seq": 2, "kind": "tool_call", "tool": "half-writ')
    assert entry["torn_sha256"] == audit.sha256_hex(side.read_bytes())
    assert verification.verify().ok
    _drain()
    assert _drained()


def test_repair_refuses_a_log_with_nothing_torn(workspace):
    audit.append("tool_call", tool="fine", ok=True)
    result = runner.invoke(app, ["audit", "repair"])
    assert result.exit_code == 2 and "no torn last line" in result.output
    assert len(audit.read()) == 1


def test_verify_fails_when_the_log_is_missing(workspace):
    result = runner.invoke(app, ["audit", "verify", "--json"])
    assert result.exit_code == 1 and "no audit log" in json.loads(result.output)["reason"]


def test_verify_fails_when_the_head_file_is_missing(workspace):
    audit.append("tool_call", tool="t", ok=True)
    (workspace / "audit.jsonl.head").unlink()
    report = verification.verify()
    assert not report.ok and "head file audit.jsonl.head is missing" in report.reason


def test_a_head_that_disagrees_with_its_entry_is_detected(workspace):
    for i in range(3):
        audit.append("tool_call", tool=f"t{i}", ok=True)
    (workspace / "audit.jsonl.head").write_text(json.dumps({"seq": 2, "hash": "f" * 64}))
    assert not verification.verify().ok


def test_entries_appended_behind_the_head_files_back_are_detected(workspace):
    for i in range(2):
        audit.append("tool_call", tool=f"t{i}", ok=True)
    head = (workspace / "audit.jsonl.head").read_text()
    for i in range(2):
        audit.append("tool_call", tool=f"forged{i}", ok=True)
    (workspace / "audit.jsonl.head").write_text(head)
    report = verification.verify()
    assert (report.ok, report.first_bad_line) == (False, 4) and "bypassed trainops" in report.reason


def test_a_head_one_entry_behind_after_a_crash_still_verifies(workspace):
    audit.append("tool_call", tool="t0", ok=True)
    head = (workspace / "audit.jsonl.head").read_text()
    audit.append("tool_call", tool="t1", ok=True)
    (workspace / "audit.jsonl.head").write_text(head)  # the crash came between the line and the head
    assert verification.verify().ok
