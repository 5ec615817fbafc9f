"""Tokens open only queued calls, signed by enough distinct human approvers, for a bounded time;
an edited queue, a rejection, a forged or a lone signature opens nothing."""
from __future__ import annotations

import json
import shutil
import subprocess
import threading

import pytest

from tests.conftest import make_ssh_key
from trainops.tools.calls import call
from trainops.tools.changes.quotas import QuotaInput
from trainops.tools.context import CallContext
from trainops.tools.governance import anchors, queue, signing, tokens
from trainops.tools.governance.gate import GateRefused
from trainops.tools.governance.tokens import approvers_needed

QUOTA = {"tenant": "acme", "gpus": 16, "priority": "high", "reason": "launch week"}
UPGRADE = {"tenant": "acme", "framework": "torch", "from_version": "2.12.0", "to_version": "2.13.0"}


def _call(tool, inp, token=None, actor="agent"):
    return call(tool, inp, CallContext(actor=actor, approval_token=token))


def _refusal(tool, inp, token=None, actor="agent") -> GateRefused:
    with pytest.raises(GateRefused) as info:
        _call(tool, inp, token, actor)
    return info.value


def _queued(tool, inp, actor="agent") -> str:
    return _refusal(tool, inp, actor=actor).pending_id


def test_a_quota_change_signed_by_two_approvers_runs(slurm_accounting, approvers):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    assert _call("set_tenant_quota", QUOTA, token).current["grp_tres"]["gres/gpu"] == 16
    assert queue.decided_calls()[0].approver == "alice, bob"


def test_a_token_signed_with_a_key_not_in_allowed_signers_is_refused(approvers, tmp_path):
    pending = _queued("set_tenant_quota", QUOTA)
    eve = make_ssh_key(tmp_path / "eve", "eve")
    with pytest.raises(ValueError, match="not an approver"):
        tokens.approve(pending, eve)
    honest = tokens.approve(pending, approvers.alice.key)
    [approval] = tokens.parse(honest)
    forged_sig = subprocess.run(["ssh-keygen", "-Y", "sign", "-n", "trainops-approval", "-f", str(eve)],
                                input=approval.payload.signed_bytes(), capture_output=True, check=True).stdout.decode()
    forged = tokens.encode([approval, tokens.Approval(payload=approval.payload, signature=forged_sig)])
    assert _refusal("set_tenant_quota", QUOTA, forged).reason == "forged"


def _second_signature_anchored_by_hand(approval, key):
    """What an approver scripting around `trainops approve` can make: another signature of the same
    call and nonce, with its anchor appended to the audit log through the Python API."""
    again = approval.payload.model_copy(update={"issued_at": approval.payload.issued_at + 1})
    signature = signing.sign(again.signed_bytes(), key)
    anchors.record(again.signed_bytes(), signature, signing.verify(again.signed_bytes(), signature),
                   subject="call", decision="token_issued", call_id=again.call_id)
    return tokens.Approval(payload=again, signature=signature)


def test_one_approver_cannot_satisfy_a_two_approver_class_by_signing_twice(approvers):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.alice.key)
    with pytest.raises(ValueError, match="alice already signed"):
        tokens.approve(pending, approvers.alice.key, cosign=token)
    [approval] = tokens.parse(token)
    twice = tokens.encode([approval, _second_signature_anchored_by_hand(approval, approvers.alice.key)])
    refused = _refusal("set_tenant_quota", QUOTA, twice)
    assert refused.reason == "too_few_approvers" and "needs 2 distinct approvers" in str(refused)


def test_one_key_listed_under_two_principals_counts_once(approvers):
    alice_pub = " ".join(approvers.alice.key.with_suffix(".pub").read_text().split()[:2])
    with open(approvers.allowed_signers, "a") as fh:
        fh.write(f"alice-again {alice_pub}\n")
    pending = _queued("set_tenant_quota", QUOTA)
    first = tokens.approve(pending, approvers.alice.key)
    [approval] = tokens.parse(first)
    as_other_principal = tokens.encode([approval, approval])
    assert _refusal("set_tenant_quota", QUOTA, as_other_principal).reason == "too_few_approvers"


def test_one_approver_with_two_listed_keys_counts_once(approvers, tmp_path):
    second_key = make_ssh_key(tmp_path / "alice-laptop", "alice-laptop")
    with open(approvers.allowed_signers, "a") as fh:
        fh.write(f"alice {' '.join(second_key.with_suffix('.pub').read_text().split()[:2])}\n")
    pending = _queued("set_tenant_quota", QUOTA)
    first = tokens.approve(pending, approvers.alice.key)
    with pytest.raises(ValueError, match="alice already signed"):
        tokens.approve(pending, second_key, cosign=first)
    [approval] = tokens.parse(first)
    both_keys = tokens.encode([approval, _second_signature_anchored_by_hand(approval, second_key)])
    assert _refusal("set_tenant_quota", QUOTA, both_keys).reason == "too_few_approvers"


def test_a_mutating_call_needs_one_approver(approvers):
    assert (approvers_needed("submit_job"), approvers_needed("set_tenant_quota"),
            approvers_needed("upgrade_framework"), approvers_needed("no_such_tool")) == (1, 2, 2, 2)


def test_the_requester_cannot_approve_their_own_call(approvers, monkeypatch):
    monkeypatch.setenv("LOGNAME", "alice")  # the operator at the CLI is alice
    pending = _queued("set_tenant_quota", QUOTA, actor="operator")
    with pytest.raises(tokens.TokenRefused, match="alice requested call .* never approves their own call"):
        tokens.approve(pending, approvers.alice.key)


def test_an_edited_pending_file_is_refused_not_approved_under_its_old_id(approvers, workspace):
    pending = _queued("set_tenant_quota", QUOTA)
    path = workspace / "governance" / "pending" / f"{pending}.json"
    item = json.loads(path.read_text())
    item["input"]["gpus"] = 4096
    path.write_text(json.dumps(item))
    with pytest.raises(ValueError, match="was edited after the call was queued"):
        tokens.approve(pending, approvers.alice.key)


def test_no_token_is_minted_for_a_call_nobody_queued(approvers):
    with pytest.raises(ValueError, match="pending approval 'aaaaaaaaaaaa' not found"):
        tokens.approve("aaaaaaaaaaaa", approvers.alice.key)


def test_a_rejected_calls_minted_token_does_not_run(approvers):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    queue.reject_pending(pending, "over budget", approvers.bob.key)
    assert _refusal("set_tenant_quota", QUOTA, token).reason == "revoked"
    _queued("set_tenant_quota", QUOTA)  # asked again: the old token stays revoked
    assert _refusal("set_tenant_quota", QUOTA, token).reason == "revoked"


def test_a_withdrawn_call_revokes_its_tokens(approvers):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    queue.withdraw(pending, "agent", "the human said no in chat")
    _queued("set_tenant_quota", QUOTA)
    assert _refusal("set_tenant_quota", QUOTA, token).reason == "revoked"


@pytest.mark.parametrize("ttl_min", [float("nan"), float("inf"), 0, -5, 61])
def test_a_ttl_that_never_ends_or_exceeds_the_maximum_is_refused(approvers, ttl_min):
    pending = _queued("set_tenant_quota", QUOTA)
    with pytest.raises(ValueError, match="ttl_min is"):
        tokens.approve(pending, approvers.alice.key, ttl_min=ttl_min)


def test_the_maximum_ttl_comes_from_the_users_config(approvers):
    with open(approvers.config, "a") as fh:
        fh.write("max_token_ttl_min = 5\n")
    pending = _queued("set_tenant_quota", QUOTA)
    with pytest.raises(ValueError, match="at most 5 minutes"):
        tokens.approve(pending, approvers.alice.key, ttl_min=6)


def test_tokens_expire_after_15_minutes_by_default(approvers):
    payload = tokens.decode(tokens.approve(_queued("set_tenant_quota", QUOTA), approvers.alice.key))
    assert payload["expires_at"] - payload["issued_at"] == pytest.approx(15 * 60)


def test_an_expired_token_is_refused(approvers):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    with pytest.raises(tokens.TokenRefused, match="expired"):
        tokens.consume(token, "set_tenant_quota", QuotaInput.model_validate(QUOTA),
                       now=tokens.decode(token)["expires_at"] + 1)


def test_a_token_opens_one_call_only(slurm_accounting, approvers):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    _call("set_tenant_quota", QUOTA, token)
    assert _refusal("set_tenant_quota", QUOTA, token).reason == "replayed"


def test_a_token_does_not_open_another_input(approvers):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    assert _refusal("set_tenant_quota", {**QUOTA, "gpus": 4096}, token).reason == "mismatch"


def test_concurrent_spending_of_one_token_runs_the_call_once(slurm_accounting, approvers):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    outcomes: list[str] = []

    def spend():
        try:
            _call("set_tenant_quota", QUOTA, token)
            outcomes.append("ran")
        except GateRefused as exc:
            outcomes.append(exc.reason)

    threads = [threading.Thread(target=spend) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ran", "replayed", "replayed", "replayed"]


def test_the_workspace_holds_no_private_key_after_a_full_approve_flow(slurm_accounting, approvers, workspace):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    _call("set_tenant_quota", QUOTA, token)
    found = subprocess.run(["grep", "-r", "PRIVATE", str(workspace)], capture_output=True, text=True)
    assert found.returncode == 1, found.stdout
    assert not (workspace / "keys").exists() or not any((workspace / "keys").iterdir())


def test_deleting_the_queues_files_does_not_let_a_spent_token_run_again(slurm_accounting, approvers, workspace):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    _call("set_tenant_quota", QUOTA, token)
    shutil.rmtree(workspace / "governance")
    _queued("set_tenant_quota", QUOTA)
    assert _refusal("set_tenant_quota", QUOTA, token).reason == "replayed"


def test_deleting_the_queues_files_does_not_lift_a_rejection(approvers, workspace):
    pending = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    queue.reject_pending(pending, "over budget", approvers.bob.key)
    shutil.rmtree(workspace / "governance")
    _queued("set_tenant_quota", QUOTA)
    assert _refusal("set_tenant_quota", QUOTA, token).reason == "revoked"


def test_rewriting_who_asked_in_the_pending_file_does_not_let_the_requester_approve(approvers, monkeypatch, workspace):
    monkeypatch.setenv("LOGNAME", "alice")
    pending = _queued("set_tenant_quota", QUOTA, actor="operator")
    path = workspace / "governance" / "pending" / f"{pending}.json"
    item = json.loads(path.read_text())
    item.update(requested_by="agent", requester_user=None)
    path.write_text(json.dumps(item))
    with pytest.raises(tokens.TokenRefused, match="never approves their own call"):
        tokens.approve(pending, approvers.alice.key)


def test_an_approval_made_outside_this_workspace_opens_nothing_here(approvers, workspace, monkeypatch, tmp_path):
    """The same call queued in a staging workspace gets the same id; its token must not run here."""
    production = _queued("set_tenant_quota", QUOTA)
    monkeypatch.setenv("TRAINOPS_HOME", str(tmp_path / "staging"))
    staging = _queued("set_tenant_quota", QUOTA)
    token = tokens.approve(staging, approvers.bob.key, cosign=tokens.approve(staging, approvers.alice.key))
    monkeypatch.setenv("TRAINOPS_HOME", str(workspace))
    refused = _refusal("set_tenant_quota", QUOTA, token)
    assert production == staging and refused.reason == "not_queued" and "not recorded" in str(refused)
