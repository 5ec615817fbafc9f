"""A writer who can rewrite the audit log and its head file can recompute the whole hash chain;
the approvers' signed anchors are what they cannot redo."""
from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from tests.conftest import make_ssh_key
from trainops.cli import app
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.governance import audit, signing, tokens, verification
from trainops.tools.governance.gate import GateRefused

QUOTA = {"tenant": "acme", "gpus": 16, "priority": "high", "reason": "launch week"}


def _approved_quota_change(approvers) -> None:
    with pytest.raises(GateRefused) as info:
        call("set_tenant_quota", QUOTA, CallContext(actor="agent"))
    pending = info.value.pending_id
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    call("set_tenant_quota", QUOTA, CallContext(actor="agent", approval_token=token))


def _rewrite_history(edit) -> None:
    """What an attacker with write access does: edit entries, then recompute every hash and the head."""
    log = audit._log_path(None)
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    edit(entries)
    prev = audit.GENESIS_HASH
    for seq, entry in enumerate(entries, start=1):
        entry.update(seq=seq, prev_hash=prev)
        entry["hash"] = prev = audit.entry_hash(entry)
    log.write_text("".join(audit.canonical_json(e) + "\n" for e in entries))
    log.with_name(log.name + ".head").write_text(audit.canonical_json({"seq": len(entries), "hash": prev}) + "\n")


def _anchors() -> list[dict]:
    return [e for e in audit.read() if e["kind"] == "anchor"]


def test_each_approval_signs_the_audit_head_it_saw_and_the_log_verifies(slurm_accounting, approvers):
    _approved_quota_change(approvers)
    first, second = _anchors()
    assert (first["principal"], second["principal"]) == ("alice", "bob")
    signed = json.loads(first["signed"])
    assert signed["audit_head"] == {"seq": first["seq"] - 1, "hash": audit.read()[first["seq"] - 2]["hash"]}
    report = verification.verify()
    assert report.ok, report.reason
    assert "every signed anchor holds" in report.reason


def test_history_rewritten_before_an_anchor_fails_audit_verify(slurm_accounting, approvers):
    _approved_quota_change(approvers)

    def hide_the_request(entries):
        entries[0]["actor"] = "operator"  # who asked for the quota change, rewritten

    _rewrite_history(hide_the_request)
    result = CliRunner().invoke(app, ["audit", "verify", "--json"])
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert "history up to that entry was rewritten after the approval" in report["reason"]
    assert report["first_bad_line"] == _anchors()[0]["seq"]


def test_an_anchor_re_signed_with_a_key_that_is_not_an_approver_fails(slurm_accounting, approvers, tmp_path):
    _approved_quota_change(approvers)
    eve = make_ssh_key(tmp_path / "eve", "eve")

    def re_sign(entries):
        anchor = next(e for e in entries if e["kind"] == "anchor")
        anchor["signature"] = signing.sign(anchor["signed"].encode(), eve)

    _rewrite_history(re_sign)
    report = verification.verify()
    assert not report.ok and "its signature does not hold" in report.reason and "not an approver" in report.reason


def test_an_anchor_whose_recorded_approver_was_changed_fails(slurm_accounting, approvers):
    _approved_quota_change(approvers)

    def rename(entries):
        next(e for e in entries if e["kind"] == "anchor")["principal"] = "bob"

    _rewrite_history(rename)
    report = verification.verify()
    assert not report.ok and "the signature is by alice" in report.reason


def test_an_anchor_by_an_approver_retired_later_still_verifies(slurm_accounting, approvers):
    _approved_quota_change(approvers)
    signed_at = max(json.loads(a["signed"])["issued_at"] for a in _anchors())
    retired = time.strftime("%Y%m%d%H%M%S", time.gmtime(signed_at + 1)) + "Z"
    approvers.allowed_signers.write_text("".join(
        line.replace(" ", f' valid-before="{retired}" ', 1) + "\n"
        for line in approvers.allowed_signers.read_text().splitlines()))
    time.sleep(max(0.0, signed_at + 2.1 - time.time()))
    with pytest.raises(signing.SigningError, match="not an approver"):
        tokens.approve(_queued_again(), approvers.alice.key)
    assert verification.verify().ok


def _queued_again() -> str:
    with pytest.raises(GateRefused) as info:
        call("set_tenant_quota", {**QUOTA, "gpus": 8}, CallContext(actor="agent"))
    return info.value.pending_id


def test_anchors_cannot_be_checked_without_the_allowed_signers_file(slurm_accounting, approvers, monkeypatch, tmp_path):
    _approved_quota_change(approvers)
    monkeypatch.setenv("TRAINOPS_CONFIG", str(tmp_path / "absent.toml"))
    report = verification.verify()
    assert not report.ok and "no allowed-signers file is configured" in report.reason
