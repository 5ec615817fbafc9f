"""Attack 7 (issue 23): one approval spent in workspace A is spent again in workspace B after the
agent appends anchor-shaped copies of A's anchors to B's log. Every signed payload names the
workspace it was signed in, and the gate checks each anchor's signed head against this log."""
from __future__ import annotations

import json

import pytest

from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.governance import audit, receipts, tokens, verification
from trainops.tools.governance.gate import GateRefused
from trainops.workspace import workspace_id

QUOTA = {"tenant": "acme", "gpus": 16, "priority": "high", "reason": "launch week"}
_CHAIN_FIELDS = ("seq", "hash", "prev_hash", "time", "kind")


def _refusal(token=None) -> GateRefused:
    with pytest.raises(GateRefused) as info:
        call("set_tenant_quota", QUOTA, CallContext(actor="agent", approval_token=token))
    return info.value


def _spent_in_a(approvers, monkeypatch, tmp_path) -> tuple[str, list[dict], str]:
    """Workspace A queues, approves and runs the call; returns the token, A's anchors and A's id."""
    monkeypatch.setenv("TRAINOPS_HOME", str(tmp_path / "workspace-a"))
    pending = _refusal().pending_id
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    call("set_tenant_quota", QUOTA, CallContext(actor="agent", approval_token=token))
    anchors_of_a = [e for e in audit.read() if e["kind"] == "anchor"]
    return token, anchors_of_a, workspace_id()


def _copy_anchors_into_b(anchors_of_a: list[dict], with_receipts: bool) -> None:
    """What the agent does in B: append A's anchors as if they were B's (and, as the same OS user,
    leave matching receipts in the receipts folder too)."""
    for anchor in anchors_of_a:
        copy = audit.append("anchor", **{k: v for k, v in anchor.items() if k not in _CHAIN_FIELDS})
        if with_receipts:
            receipts.leave(copy)


@pytest.fixture
def in_b(slurm_accounting, approvers, monkeypatch, tmp_path, workspace):
    token, anchors_of_a, id_of_a = _spent_in_a(approvers, monkeypatch, tmp_path)
    monkeypatch.setenv("TRAINOPS_HOME", str(workspace))
    assert _refusal().pending_id  # the same call, queued in B under the same content id
    return token, anchors_of_a, id_of_a


def test_an_approval_signed_in_another_workspace_is_refused_by_its_workspace_id(in_b):
    token, anchors_of_a, id_of_a = in_b
    _copy_anchors_into_b(anchors_of_a, with_receipts=True)
    refused = _refusal(token)
    assert refused.reason == "mismatch" and f"signed in workspace {id_of_a}" in str(refused)
    assert not [e for e in audit.read() if e["kind"] == "token_spent"]
    report = verification.verify()
    assert not report.ok and "copied from another workspace" in report.reason


def test_a_copied_anchor_without_a_receipt_refuses_every_token(in_b):
    token, anchors_of_a, _ = in_b
    _copy_anchors_into_b(anchors_of_a, with_receipts=False)
    refused = _refusal(token)
    assert refused.reason == "decisions_cut" and "has no receipt" in str(refused)


def test_a_copied_anchor_is_refused_by_its_signed_head_even_under_the_other_workspaces_id(in_b, workspace,
                                                                                          monkeypatch, tmp_path):
    token, anchors_of_a, id_of_a = in_b
    (workspace / "workspace.id").write_text(id_of_a + "\n")  # B now claims to be A
    monkeypatch.setenv("TRAINOPS_RECEIPTS_DIR", str(tmp_path / "agents-own-receipts"))
    _copy_anchors_into_b(anchors_of_a, with_receipts=True)
    refused = _refusal(token)
    assert refused.reason == "not_queued" and "does not belong to this log" in str(refused)
    assert "history up to that entry was rewritten" in str(refused)


def test_every_signed_payload_names_its_workspace(approvers):
    pending = _refusal().pending_id
    token = tokens.approve(pending, approvers.alice.key)
    [anchor] = [e for e in audit.read() if e["kind"] == "anchor"]
    assert json.loads(anchor["signed"])["workspace_id"] == workspace_id() == anchor["workspace_id"]
    assert tokens.parse(token)[0].payload.workspace_id == workspace_id()


def test_an_edited_workspace_id_is_one_clear_error(workspace):
    workspace_id()
    (workspace / "workspace.id").write_text("../../etc\n")
    with pytest.raises(ValueError, match="not a workspace id"):
        workspace_id()
