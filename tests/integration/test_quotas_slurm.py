"""Tenant quotas through Slurm's own accounting, on the sandbox cluster (3 nodes x 2 CPUs, MariaDB +
slurmdbd, limits and QOS enforced): a quota needs two approvers at the CLI, lands in sacctmgr, Slurm
itself holds a tenant's job over it (pending, with Slurm's reason) while a job within it and another
account's job run, and rollback_change restores the exact previous account and QOS."""
from __future__ import annotations

import json
import subprocess
import time

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.calls import call
from trainops.tools.changes.quotas import cluster, current_state
from trainops.tools.changes.records import read_change
from trainops.tools.context import CallContext
from trainops.tools.governance import tokens
from trainops.tools.governance.gate import GateRefused
from trainops.tools.schedulers.base import JobSpec, SchedulerError
from trainops.tools.schedulers.slurm import SlurmScheduler

pytestmark = [pytest.mark.services, pytest.mark.slow]
runner = CliRunner()


def _sacctmgr(*args: str) -> str:
    return subprocess.run(["sacctmgr", "-n", "-p", *args], capture_output=True, text=True, check=True,
                          timeout=30).stdout


def _approved(tool: str, inp: dict, approvers):
    """Queue the call as the agent, have alice and bob sign it, run it with their token."""
    with pytest.raises(GateRefused) as info:
        call(tool, inp, CallContext(actor="agent"))
    pending = info.value.pending_id
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    return call(tool, inp, CallContext(actor="agent", approval_token=token))


def _rollback(change_id: str, approvers):
    record = read_change(change_id)
    return _approved("rollback_change", {"change_id": change_id, "commands": record.rollback_commands}, approvers)


def _squeue(job_id: str) -> tuple[str, str]:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%a|%q"], capture_output=True, text=True,
                         timeout=15).stdout.strip()
    state, reason, account, qos = (out.split("|") + ["", "", "", ""])[:4]
    return state, reason, account, qos


def _wait_for(what: str, ready, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_a_quota_needs_approval_at_the_cli_and_then_shows_in_sacctmgr(sandbox_cluster, approvers):
    quota = {"tenant": "qland", "cpus": 2, "gpus": 1, "max_jobs": 3, "priority": "high", "reason": "launch week"}
    queued = runner.invoke(app, ["tool", "call", "set_tenant_quota", "--input", json.dumps(quota), "--json"])
    assert queued.exit_code == 2, queued.output
    error = json.loads(queued.stdout)["error"]
    assert "pending approval" in error
    assert _sacctmgr("show", "qos", "where", "name=qland") == ""  # nothing lands without the humans
    assert _sacctmgr("show", "account", "where", "name=qland") == ""
    pending = error.split("pending approval ")[1].split()[0]
    first = runner.invoke(app, ["approve", "--pending", pending, "--key", str(approvers.alice.key), "--json"])
    second = runner.invoke(app, ["approve", "--pending", pending, "--key", str(approvers.bob.key), "--cosign",
                                 json.loads(first.stdout)["token"], "--json"])
    assert second.exit_code == 0, second.output
    ran = runner.invoke(app, ["tool", "call", "set_tenant_quota", "--input", json.dumps(quota), "--approval-token",
                              json.loads(second.stdout)["token"], "--json"])
    assert ran.exit_code == 0, ran.output
    assert _sacctmgr("show", "qos", "where", "name=qland", "format=name,grptres,grpjobs,priority") == \
        "qland|cpu=2,gres/gpu=1|3|1000|\n"
    rows = _sacctmgr("show", "assoc", "where", "account=qland", "format=account,user,qos,defaultqos").splitlines()
    assert set(rows) == {"qland||qland|qland|", "qland|root|qland|qland|"}  # the account, and root in it
    out = json.loads(ran.stdout)
    record = read_change(out["change_id"])
    assert (record.kind, record.target, record.previous["account"], record.previous["qos"]) == (
        "tenant_quota", "qland", False, False)
    assert record.applied == current_state("qland") and record.approved_call == pending
    assert record.rollback_commands[0][:4] == ["sacctmgr", "-i", "delete", "account"]


@pytest.mark.parametrize("limit, reason", [({"cpus": 1}, "QOSGrpCpuLimit"), ({"max_jobs": 1}, "QOSGrpJobsLimit")])
def test_slurm_holds_a_tenants_job_over_quota_pending_with_its_own_reason(sandbox_cluster, approvers, limit, reason):
    tenant = "qhold-" + next(iter(limit)).replace("_", "")
    change = _approved("set_tenant_quota", {"tenant": tenant, **limit, "priority": "normal", "reason": "hold test"},
                       approvers)
    scheduler = SlurmScheduler()

    def job(name: str, tenant_id: str | None) -> str:
        return scheduler.submit(JobSpec(name=name, command=["sleep", "120"], procs_per_node=1,
                                        tenant=tenant_id)).job_id

    within, over, other = job("within", tenant), job("over", tenant), job("other", None)
    try:
        _wait_for("the within-quota and the other account's job to run",
                  lambda: _squeue(within)[0] == "RUNNING" and _squeue(other)[0] == "RUNNING")
        assert _squeue(within)[2:] == (tenant, tenant)  # account and QOS: the tenant's
        time.sleep(4)  # several scheduler passes (sched_interval=2, bf_interval=1) with 4 CPUs still free
        assert _squeue(over)[:2] == ("PENDING", reason)
        with pytest.raises(SchedulerError, match="set_tenant_quota"):  # no account: Slurm refuses, we name the fix
            job("noacct", "qnone")
    finally:
        subprocess.run(["scancel", within, over, other], timeout=15)
    _wait_for("the tenant's jobs to leave the queue", lambda: _squeue(within)[0] in ("", "COMPLETED", "CANCELLED")
              and _squeue(over)[0] in ("", "CANCELLED"))
    undone = _rollback(change.change_id, approvers)
    assert undone.restored and undone.differences == []
    assert _sacctmgr("show", "account", "where", f"name={tenant}") == ""


def test_rollback_restores_the_exact_previous_account_and_qos(sandbox_cluster, approvers):
    first = _approved("set_tenant_quota", {"tenant": "qroll", "cpus": 4, "priority": "low", "reason": "first"},
                      approvers)
    recorded = current_state("qroll")
    second = _approved("set_tenant_quota", {"tenant": "qroll", "gpus": 2, "max_jobs": 1, "priority": "high",
                                            "reason": "second"}, approvers)
    assert second.previous == recorded and second.current != recorded
    assert _sacctmgr("show", "qos", "where", "name=qroll", "format=name,grptres,grpjobs,priority") == \
        "qroll|gres/gpu=2|1|1000|\n"
    undone = _rollback(second.change_id, approvers)
    assert undone.restored and undone.differences == []
    assert current_state("qroll") == recorded
    assert _sacctmgr("show", "qos", "where", "name=qroll", "format=name,grptres,grpjobs,priority") == \
        "qroll|cpu=4||10|\n"
    again = {"change_id": second.change_id, "commands": read_change(second.change_id).rollback_commands}
    with pytest.raises(GateRefused, match="already rolled back") as refused:  # refused before any human is asked
        call("rollback_change", again, CallContext(actor="agent"))
    assert refused.value.pending_id is None
    assert _rollback(first.change_id, approvers).restored  # before the first change: no account, no QOS
    assert _sacctmgr("show", "qos", "where", "name=qroll") == "" and current_state("qroll") == first.previous


@pytest.mark.parametrize("kind", ["account", "qos"])
def test_a_tenant_id_naming_an_account_or_qos_trainops_did_not_make_is_refused_before_anyone_signs(sandbox_cluster,
                                                                                                   kind):
    """An administrator's own account (or QOS) of that name: a quota would rewrite its limits and the first
    change's rollback would delete it. Slurm keeps who made it (the description only its administrators
    write); the gate refuses the call before it is queued, and the account is left as it was."""
    name = f"legacy-{kind}"
    _sacctmgr("-i", "add", kind, name, *([f"cluster={cluster()}"] if kind == "account" else []),
              "description=the physics group's")
    shown = _sacctmgr("show", kind, "where", f"name={name}", "format=name,description" if kind == "qos"
                      else "format=account,description")
    with pytest.raises(GateRefused, match="that trainops did not make") as refused:
        call("set_tenant_quota", {"tenant": name, "cpus": 2, "priority": "high", "reason": "take it over"},
             CallContext(actor="operator"))
    assert refused.value.rule_id == "R-SEC-3" and refused.value.pending_id is None
    assert _sacctmgr("show", kind, "where", f"name={name}", "format=name,description" if kind == "qos"
                     else "format=account,description") == shown


def test_an_account_made_after_the_approval_is_still_not_taken_over(sandbox_cluster, approvers):
    """The gate checks ownership again when the signed call runs: an administrator's account made between
    the signatures and the run is refused, token or not, and keeps its own limits."""
    inp = {"tenant": "late", "cpus": 2, "priority": "high", "reason": "a quota for late"}
    with pytest.raises(GateRefused) as info:
        call("set_tenant_quota", inp, CallContext(actor="agent"))
    pending = info.value.pending_id
    token = tokens.approve(pending, approvers.bob.key, cosign=tokens.approve(pending, approvers.alice.key))
    _sacctmgr("-i", "add", "account", "late", f"cluster={cluster()}", "description=made by hand")
    with pytest.raises(GateRefused, match="R-SEC-3.*that trainops did not make"):
        call("set_tenant_quota", inp, CallContext(actor="agent", approval_token=token))
    assert _sacctmgr("show", "qos", "where", "name=late") == ""
