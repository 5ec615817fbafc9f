"""The action gate: approval tokens bound to one exact call, forbidden actions, tenant isolation,
input validation. Calls go through the real `trainops.tools.base.call` and the real tenancy tools."""
from __future__ import annotations

import json
import time

import pytest
from pydantic import BaseModel

from trainops.tools.base import CallContext, ToolError, ToolSpec, call
from trainops.tools.governance import audit, signing, tokens
from trainops.tools.governance.gate import GateRefused, before_call
from trainops.tools.tenancy import check_tenant_path, tenant_path

QUOTA = {"tenant": "acme", "gpus": 16, "priority": "high", "reason": "launch week"}
POLICY = {"scope": "partition", "target": "gpu-a", "settings": {"preempt": "requeue"},
          "change": {"impact": "partition gpu-a: tenants acme, globex", "shadow_queue_result": "p95 wait -12% over 7 days",
                     "shadow_queue_passed": True, "rollback_command": "trainops tool call change_scheduler_policy ..."}}
UPGRADE = {"tenant": "acme", "framework": "torch", "from_version": "2.12.0", "to_version": "2.13.0"}


def _call(tool, inp, token=None):
    return call(tool, inp, CallContext(actor="test", approval_token=token))


def _refusal(tool, inp, token=None) -> GateRefused:
    with pytest.raises(GateRefused) as info:
        _call(tool, inp, token)
    return info.value


@pytest.mark.rule("R-SEC-1", case="violation")
def test_quota_change_without_approval_is_refused_and_queued_as_pending():
    refused = _refusal("set_tenant_quota", QUOTA)
    assert (refused.reason, refused.rule_id) == ("missing_token", "R-SEC-1")
    assert f"trainops approve --pending {refused.pending_id}" in str(refused)
    [pending] = tokens.pending_calls()
    assert (pending.id, pending.tool, pending.input["gpus"], pending.requested_by) == (refused.pending_id, "set_tenant_quota", 16, "test")


@pytest.mark.rule("R-SEC-1", case="compliant")
@pytest.mark.rule("R-SEC-4", case="compliant")
def test_quota_change_with_a_token_for_that_exact_call_is_applied(workspace):
    _refusal("set_tenant_quota", QUOTA)
    token = tokens.issue_token("set_tenant_quota", QUOTA, approver="alice")
    out = _call("set_tenant_quota", QUOTA, token)
    assert out.current["gpus"] == 16
    assert json.loads((workspace / "tenants" / "acme" / "quota.json").read_text())["priority"] == "high"
    assert tokens.pending_calls() == [] and tokens.decided_calls()[0].approver == "alice"


@pytest.mark.rule("R-SEC-4", case="violation")
def test_irreversible_call_without_token_is_refused():
    refused = _refusal("upgrade_framework", UPGRADE)
    assert (refused.reason, refused.rule_id) == ("missing_token", "R-SEC-4")


def test_replayed_token_is_refused():
    token = tokens.issue_token("set_tenant_quota", QUOTA, approver="alice")
    _call("set_tenant_quota", QUOTA, token)
    assert _refusal("set_tenant_quota", QUOTA, token).reason == "replayed"


def test_token_for_a_different_input_is_refused():
    token = tokens.issue_token("set_tenant_quota", QUOTA, approver="alice")
    assert _refusal("set_tenant_quota", {**QUOTA, "gpus": 512}, token).reason == "mismatch"


def test_token_for_a_different_tool_is_refused():
    token = tokens.issue_token("set_tenant_quota", QUOTA, approver="alice")
    refused = _refusal("upgrade_framework", UPGRADE, token)
    assert refused.reason == "mismatch" and "'set_tenant_quota', not 'upgrade_framework'" in str(refused)


def test_expired_token_is_refused():
    token = tokens.issue_token("set_tenant_quota", QUOTA, approver="alice", ttl_s=0.01)
    time.sleep(0.05)
    assert _refusal("set_tenant_quota", QUOTA, token).reason == "expired"


def test_token_signed_by_another_key_is_refused():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    signing.public_key_pem()  # the workspace key exists; the forger holds a different one
    body, _ = tokens.issue_token("set_tenant_quota", QUOTA, approver="alice").split(".")
    forged = f"{body}.{signing.b64(Ed25519PrivateKey.generate().sign(body.encode()))}"
    assert _refusal("set_tenant_quota", QUOTA, forged).reason == "forged"


def test_token_with_an_edited_payload_is_refused():
    body, sig = tokens.issue_token("set_tenant_quota", QUOTA, approver="alice").split(".")
    payload = json.loads(signing.unb64(body))
    payload["expires_at"] += 86400
    edited = f"{signing.b64(audit.canonical_json(payload).encode())}.{sig}"
    assert _refusal("set_tenant_quota", QUOTA, edited).reason == "forged"


def test_garbage_token_is_refused_as_malformed():
    assert _refusal("set_tenant_quota", QUOTA, "not-a-token").reason == "malformed"


@pytest.mark.rule("R-SEC-2", case="violation")
def test_global_scheduler_policy_change_is_refused_even_with_a_token():
    change = {**POLICY, "scope": "global", "target": ""}
    token = tokens.issue_token("change_scheduler_policy", change, approver="alice")
    refused = _refusal("change_scheduler_policy", change, token)
    assert (refused.reason, refused.rule_id) == ("forbidden", "R-SEC-2")
    assert tokens.pending_calls() == []


def test_forced_cross_version_upgrade_is_refused_as_forbidden():
    forced = {**UPGRADE, "to_version": "3.1.0", "force": True}
    refused = _refusal("upgrade_framework", forced, tokens.issue_token("upgrade_framework", forced, approver="alice"))
    assert (refused.reason, refused.rule_id) == ("forbidden", "R-SEC-2")


def test_unforced_upgrade_skipping_minor_versions_is_refused():
    refused = _refusal("upgrade_framework", {**UPGRADE, "to_version": "2.15.0"})
    assert refused.reason == "invalid_input" and "one minor version at a time" in str(refused)


@pytest.mark.rule("R-SEC-2", case="compliant")
def test_partition_policy_change_and_one_step_upgrade_are_allowed_with_tokens():
    out = _call("change_scheduler_policy", POLICY, tokens.issue_token("change_scheduler_policy", POLICY, approver="alice"))
    assert out.rollback_command.startswith("trainops tool call")
    up = _call("upgrade_framework", UPGRADE, tokens.issue_token("upgrade_framework", UPGRADE, approver="alice"))
    assert up.pinned_version == "2.13.0"


def test_scheduler_change_without_rollback_is_refused_before_the_gate():
    bad = {**POLICY, "change": {**POLICY["change"], "rollback_command": ""}}
    with pytest.raises(ToolError, match="R-SCH-1: SchedulerChange lacks rollback_command"):
        _call("change_scheduler_policy", bad)


class _Probe(BaseModel):
    tenant: str
    checkpoint_dir: str


def _probe_spec():
    return ToolSpec(name="probe", description="test probe", Input=_Probe, Output=_Probe, risk="read", fn=lambda i: i)


@pytest.mark.rule("R-SEC-3", case="violation")
@pytest.mark.parametrize("path", ["../globex/checkpoints", "/etc", "checkpoints/../../globex"])
def test_path_outside_the_tenant_root_is_refused(path):
    with pytest.raises(ValueError, match="R-SEC-3: path=.* is outside tenant 'acme'"):
        check_tenant_path("acme", path)
    with pytest.raises(GateRefused, match=r"R-SEC-3\): checkpoint_dir: R-SEC-3"):
        before_call(_probe_spec(), _Probe(tenant="acme", checkpoint_dir=path), CallContext())


@pytest.mark.rule("R-SEC-3", case="compliant")
def test_path_inside_the_tenant_root_is_accepted():
    ckpt = tenant_path("acme", "checkpoints")
    assert check_tenant_path("acme", ckpt / "step-00000010") == ckpt / "step-00000010"
    before_call(_probe_spec(), _Probe(tenant="acme", checkpoint_dir=str(ckpt)), CallContext())


@pytest.mark.rule("R-TOOL-1", case="violation")
def test_invalid_tool_input_is_refused_naming_the_field():
    with pytest.raises(ToolError, match=r"set_tenant_quota: invalid input: .*gpus"):
        _call("set_tenant_quota", {**QUOTA, "gpus": -1})


@pytest.mark.rule("R-TOOL-1", case="compliant")
def test_valid_call_passes_the_gate_and_is_audited():
    _call("set_tenant_quota", QUOTA, tokens.issue_token("set_tenant_quota", QUOTA, approver="alice"))
    kinds = [(e["kind"], e.get("decision")) for e in audit.read()]
    assert kinds == [("approval", "token_issued"), ("gate", "allowed"), ("intent", None), ("tool_call", None)]
    assert audit.read()[-1]["input"]["gpus"] == 16


def test_tokens_expire_after_15_minutes_by_default():
    payload = tokens.decode(tokens.issue_token("set_tenant_quota", QUOTA, approver="alice"))
    assert payload["expires_at"] - payload["issued_at"] == pytest.approx(15 * 60)
    assert payload["input_sha256"] == tokens.input_hash(QUOTA)


def test_token_minted_from_the_cli_for_a_call_opens_that_call():
    from typer.testing import CliRunner

    from trainops.cli import app

    minted = CliRunner().invoke(app, ["approve", "--call", "set_tenant_quota", "--input", json.dumps(QUOTA),
                                      "--by", "alice", "--json"])
    assert minted.exit_code == 0, minted.output
    assert _call("set_tenant_quota", QUOTA, json.loads(minted.output)["token"]).current["gpus"] == 16


def test_cli_refuses_to_mint_a_token_for_an_input_the_tool_would_reject():
    from typer.testing import CliRunner

    from trainops.cli import app

    result = CliRunner().invoke(app, ["approve", "--call", "set_tenant_quota", "--input", '{"tenant": "acme"}',
                                      "--by", "alice"])
    assert result.exit_code == 2 and "gpus: Field required" in result.output


def test_check_input_lets_the_agent_refuse_a_forbidden_call_before_asking_a_human():
    from trainops.tools.base import get
    from trainops.tools.governance.gate import check_input

    spec = get("change_scheduler_policy")
    with pytest.raises(GateRefused, match="forbidden"):
        check_input(spec, spec.Input.model_validate({**POLICY, "scope": "global", "target": ""}), CallContext())
    assert tokens.pending_calls() == []


def test_cli_refuses_to_mint_a_token_for_a_forbidden_call():
    from typer.testing import CliRunner

    from trainops.cli import app

    forbidden = {**POLICY, "scope": "global", "target": ""}
    result = CliRunner().invoke(app, ["approve", "--call", "change_scheduler_policy", "--input", json.dumps(forbidden),
                                      "--by", "alice"])
    assert result.exit_code == 2 and "no token minted" in result.output and "forbidden" in result.output
    assert not any(e.get("decision") == "token_issued" for e in audit.read())
