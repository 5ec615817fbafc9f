"""Attack 3 (issue 23): the newest signed decision cut from the workspace. The agent deletes the
last audit line (a signed rejection or revocation), rewrites audit.jsonl.head so the chain still
verifies, and spends what the decision took back. The approvers' receipts, kept outside the
workspace, make the gate refuse and both verifiers fail, naming the receipt."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.security.test_packs import _pack
from trainops.cli import app
from trainops.tools.governance import approvals, audit

QUOTA = {"tenant": "acme", "gpus": 4096, "priority": "high", "reason": "launch week"}


def _cli(*args) -> object:
    return CliRunner().invoke(app, [str(a) for a in args])


def _cut_last_line() -> None:
    """What the agent does with its shell: drop the newest entry and make the head agree."""
    log = audit._log_path(None)
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(lines[:-1]))
    last = json.loads(lines[-2])
    head = audit.canonical_json({"seq": last["seq"], "hash": last["hash"]})
    log.with_name(log.name + ".head").write_text(head + "\n")
    assert audit.verify_chain().ok  # the chain alone no longer sees anything


def _two_approvals_then_a_rejection(approvers) -> str:
    _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(QUOTA))
    [item] = json.loads(_cli("approvals", "--json").output)
    first = _cli("approve", "--pending", item["id"], "--key", approvers.alice.key, "--json")
    token = json.loads(_cli("approve", "--pending", item["id"], "--key", approvers.bob.key, "--json",
                            "--cosign", json.loads(first.output)["token"]).output)["token"]
    rejected = _cli("reject", "--pending", item["id"], "--key", approvers.bob.key, "--note", "exceeds the cluster")
    assert rejected.exit_code == 0, rejected.output
    return token


def test_a_rejection_cut_from_the_log_does_not_let_its_revoked_token_run(approvers):
    token = _two_approvals_then_a_rejection(approvers)
    _cut_last_line()
    requeued = _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(QUOTA))
    assert requeued.exit_code != 0 and "queued as pending approval" in requeued.output
    spent = _cli("tool", "call", "set_tenant_quota", "--input", json.dumps(QUOTA), "--approval-token", token, "--json")
    assert spent.exit_code != 0
    assert "decisions_cut" in spent.output and "rejected by bob" in spent.output and "receipt" in spent.output
    assert "Traceback" not in spent.output
    assert not [e for e in audit.read() if e.get("kind") == "token_spent"]
    verified = _cli("audit", "verify", "--json")
    report = json.loads(verified.output)
    assert verified.exit_code == 1 and not report["ok"]
    assert "rejected by bob" in report["reason"] and "was cut or rewritten" in report["reason"]


def test_the_newest_decision_cut_with_nothing_after_it_is_still_caught(approvers):
    token = _two_approvals_then_a_rejection(approvers)
    _cut_last_line()
    report = json.loads(_cli("audit", "verify", "--json").output)
    assert not report["ok"] and "the audit log ends at entry" in report["reason"] and "receipt" in report["reason"]
    assert token  # the agent holds the token, and the log ends where it was minted


def test_a_revocation_cut_with_its_decision_file_leaves_the_pack_unapproved(workspace, approvers):
    pack = _pack(workspace)
    assert _cli("approve", pack, "--key", approvers.alice.key, "--note", "ship").exit_code == 0
    revoked = _cli("reject", pack, "--key", approvers.bob.key, "--note", "baseline on a noisy host")
    assert revoked.exit_code == 0, revoked.output
    (approvals.decisions_dir(pack) / "0002.json").unlink()
    _cut_last_line()
    verified = _cli("approvals", "verify", pack, "--json")
    assert verified.exit_code == 1, verified.output
    result = json.loads(verified.output)
    assert not result["ok"] and "rejected by bob" in result["reason"] and "receipt" in result["reason"]
    report = json.loads(_cli("audit", "verify", "--json").output)
    assert not report["ok"] and "rejected by bob on pack" in report["reason"]
    listed = {i["id"]: i for i in json.loads(_cli("approvals", "--json").output)}
    assert listed[pack]["status"] == "corrupt"
    again = _cli("approve", pack, "--key", approvers.alice.key)
    assert again.exit_code != 0 and "receipt" in again.output and "Traceback" not in again.output


def test_a_decision_file_deleted_alone_still_refuses(workspace, approvers):
    pack = _pack(workspace)
    assert _cli("approve", pack, "--key", approvers.alice.key).exit_code == 0
    assert _cli("reject", pack, "--key", approvers.bob.key, "--note", "no drill").exit_code == 0
    (approvals.decisions_dir(pack) / "0002.json").unlink()
    result = json.loads(_cli("approvals", "verify", pack, "--json").output)
    assert not result["ok"] and "decision 2 (rejected by bob" in result["reason"]


def test_an_untouched_workspace_verifies_against_its_receipts(workspace, approvers):
    pack = _pack(workspace)
    assert _cli("approve", pack, "--key", approvers.alice.key).exit_code == 0
    report = json.loads(_cli("audit", "verify", "--json").output)
    assert report["ok"] and "every receipt" in report["reason"]
    assert json.loads(_cli("approvals", "verify", pack, "--json").output)["ok"]


def test_a_receipts_folder_nobody_can_write_refuses_before_anything_is_signed(workspace, approvers, monkeypatch,
                                                                              tmp_path):
    pack = _pack(workspace)
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("TRAINOPS_RECEIPTS_DIR", str(blocked))
    result = _cli("approve", pack, "--key", approvers.alice.key)
    assert result.exit_code != 0 and "receipts folder" in result.output and "Traceback" not in result.output
    assert not approvals.decisions_dir(pack).exists()
