"""The action gate: approval tokens bound to one exact call, forbidden actions, tenant isolation,
input validation. Calls go through the real `trainops.tools.calls.call` and the real tenancy tools."""
from __future__ import annotations

import json
import time

import pytest
from pydantic import BaseModel
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.base import ToolError, ToolSpec
from trainops.tools.calls import call, get
from trainops.tools.changes.quotas import QuotaInput
from trainops.tools.changes.tenancy import check_tenant_path, tenant_path
from trainops.tools.context import CallContext
from trainops.tools.governance import audit, queue, tokens
from trainops.tools.governance.gate import GateRefused, before_call, check_input

QUOTA = {"tenant": "acme", "gpus": 16, "priority": "high", "reason": "launch week"}
POLICY = {"scope": "partition", "target": "gpu-a", "settings": {"PreemptMode": "REQUEUE"},
          "change": {"impact": "partition gpu-a: tenants acme, globex"}}
UPGRADE = {"tenant": "acme", "framework": "torch", "from_version": "2.12.0", "to_version": "2.13.0"}


def _call(tool, inp, token=None):
    return call(tool, inp, CallContext(actor="agent", approval_token=token))


def _refusal(tool, inp, token=None) -> GateRefused:
    with pytest.raises(GateRefused) as info:
        _call(tool, inp, token)
    return info.value


def _token(tool, inp, *signers) -> str:
    """Queue the call (it arrives without a token), then each approver signs it with their own key."""
    pending = _refusal(tool, inp).pending_id
    token = None
    for approver in signers:
        token = tokens.approve(pending, approver.key, cosign=token)
    return token


@pytest.mark.rule("R-SEC-1", case="violation")
def test_quota_change_without_approval_is_refused_and_queued_as_pending():
    refused = _refusal("set_tenant_quota", QUOTA)
    assert (refused.reason, refused.rule_id) == ("missing_token", "R-SEC-1")
    assert f"trainops approve --pending {refused.pending_id}" in str(refused)
    [pending] = queue.pending_calls()
    assert (pending.id, pending.tool, pending.input["gpus"], pending.requested_by) == (
        refused.pending_id, "set_tenant_quota", 16, "agent")


@pytest.mark.rule("R-SEC-1", case="compliant")
@pytest.mark.rule("R-SEC-4", case="compliant")
@pytest.mark.rule("R-SEC-6", case="compliant")
def test_quota_change_with_two_approvers_signing_that_exact_call_is_applied(slurm_accounting, workspace, approvers):
    token = _token("set_tenant_quota", QUOTA, approvers.alice, approvers.bob)
    out = _call("set_tenant_quota", QUOTA, token)
    assert (out.current["grp_tres"]["gres/gpu"], out.current["priority"]) == (16, 1000)  # read back from sacctmgr
    assert queue.pending_calls() == [] and queue.decided_calls()[0].approver == "alice, bob"


@pytest.mark.rule("R-SEC-6", case="violation")
def test_quota_change_signed_by_one_approver_is_refused(approvers):
    refused = _refusal("set_tenant_quota", QUOTA, _token("set_tenant_quota", QUOTA, approvers.alice))
    assert (refused.reason, refused.rule_id) == ("too_few_approvers", "R-SEC-1")
    assert "needs 2 distinct approvers; this token has 1 (alice)" in str(refused)


@pytest.mark.rule("R-SEC-4", case="violation")
def test_irreversible_call_without_token_is_refused():
    refused = _refusal("upgrade_framework", UPGRADE)
    assert (refused.reason, refused.rule_id) == ("missing_token", "R-SEC-4")


def test_replayed_token_is_refused(slurm_accounting, approvers):
    token = _token("set_tenant_quota", QUOTA, approvers.alice, approvers.bob)
    _call("set_tenant_quota", QUOTA, token)
    assert _refusal("set_tenant_quota", QUOTA, token).reason == "replayed"


def test_token_for_a_different_input_is_refused(approvers):
    token = _token("set_tenant_quota", QUOTA, approvers.alice, approvers.bob)
    assert _refusal("set_tenant_quota", {**QUOTA, "gpus": 512}, token).reason == "mismatch"


def test_token_for_a_different_tool_is_refused(approvers):
    token = _token("set_tenant_quota", QUOTA, approvers.alice, approvers.bob)
    refused = _refusal("upgrade_framework", UPGRADE, token)
    assert refused.reason == "mismatch" and "'set_tenant_quota', not 'upgrade_framework'" in str(refused)


def test_expired_token_is_refused(approvers):
    token = _token("set_tenant_quota", QUOTA, approvers.alice, approvers.bob)
    with pytest.raises(tokens.TokenRefused, match="expired"):
        tokens.consume(token, "set_tenant_quota", QuotaInput.model_validate(QUOTA), now=time.time() + 15 * 60 + 1)


def test_token_with_an_edited_payload_is_refused(approvers):
    first, second = tokens.parse(_token("set_tenant_quota", QUOTA, approvers.alice, approvers.bob))
    longer = [tokens.Approval(payload=a.payload.model_copy(update={"expires_at": a.payload.expires_at + 60}),
                              signature=a.signature) for a in (first, second)]
    assert _refusal("set_tenant_quota", QUOTA, tokens.encode(longer)).reason == "forged"


def test_garbage_token_is_refused_as_malformed():
    assert _refusal("set_tenant_quota", QUOTA, "not-a-token").reason == "malformed"


@pytest.mark.rule("R-SEC-2", case="violation")
def test_global_scheduler_policy_change_is_refused_outright_and_never_queued_for_approval():
    change = {**POLICY, "scope": "global", "target": ""}
    refused = _refusal("change_scheduler_policy", change)
    assert (refused.reason, refused.rule_id) == ("forbidden", "R-SEC-2")
    assert queue.pending_calls() == []


def test_forced_cross_version_upgrade_is_refused_as_forbidden():
    forced = {**UPGRADE, "to_version": "3.1.0", "force": True}
    refused = _refusal("upgrade_framework", forced)
    assert (refused.reason, refused.rule_id) == ("forbidden", "R-SEC-2")


def test_unforced_upgrade_skipping_minor_versions_is_refused():
    refused = _refusal("upgrade_framework", {**UPGRADE, "to_version": "2.15.0"})
    assert refused.reason == "invalid_input" and "one minor version at a time" in str(refused)


@pytest.mark.rule("R-SEC-2", case="compliant")
def test_partition_policy_change_and_one_step_upgrade_are_allowed_with_two_approvers(approvers):
    policy_token = _token("change_scheduler_policy", POLICY, approvers.alice, approvers.bob)
    with pytest.raises(ToolError) as passed_gate:  # past the gate, the tool reads the partition from Slurm
        _call("change_scheduler_policy", POLICY, policy_token)
    assert not isinstance(passed_gate.value, GateRefused) and passed_gate.value.tool == "change_scheduler_policy"
    up = _call("upgrade_framework", UPGRADE, _token("upgrade_framework", UPGRADE, approvers.bob, approvers.alice))
    assert up.pinned_version == "2.13.0"


def test_scheduler_change_without_impact_is_refused_before_the_gate():
    bad = {**POLICY, "change": {"impact": ""}}
    with pytest.raises(ToolError, match="R-SCH-1: SchedulerChange lacks impact"):
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
def test_valid_call_passes_the_gate_and_is_audited(slurm_accounting, approvers):
    _call("set_tenant_quota", QUOTA, _token("set_tenant_quota", QUOTA, approvers.alice, approvers.bob))
    kinds = [(e["kind"], e.get("decision")) for e in audit.read()]
    assert kinds[-6:] == [("anchor", "token_issued"), ("token_spent", None), ("gate", "allowed"), ("intent", None),
                          ("change_written", None), ("tool_call", None)]  # the change record, bound as it is written
    assert audit.read()[-1]["input"]["gpus"] == 16


def test_a_pending_call_approved_from_the_cli_by_two_approvers_opens_that_call(slurm_accounting, approvers):
    pending = _refusal("set_tenant_quota", QUOTA).pending_id
    first = CliRunner().invoke(app, ["approve", "--pending", pending, "--key", str(approvers.alice.key), "--json"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["signatures"] == 1 and json.loads(first.output)["approvers_needed"] == 2
    second = CliRunner().invoke(app, ["approve", "--pending", pending, "--key", str(approvers.bob.key),
                                      "--cosign", json.loads(first.output)["token"], "--json"])
    assert second.exit_code == 0, second.output
    assert _call("set_tenant_quota", QUOTA, json.loads(second.output)["token"]).current["grp_tres"]["gres/gpu"] == 16


def test_cli_has_no_way_to_mint_a_token_for_a_call_nobody_queued(approvers):
    result = CliRunner().invoke(app, ["approve", "--call", "set_tenant_quota", "--input", json.dumps(QUOTA),
                                      "--key", str(approvers.alice.key)])
    assert result.exit_code == 2 and "No such option: --call" in result.output
    assert not any(e["kind"] == "anchor" for e in audit.read())


def test_check_input_lets_the_agent_refuse_a_forbidden_call_before_asking_a_human():
    spec = get("change_scheduler_policy")
    with pytest.raises(GateRefused, match="forbidden"):
        check_input(spec, spec.Input.model_validate({**POLICY, "scope": "global", "target": ""}), CallContext())
    assert queue.pending_calls() == []
