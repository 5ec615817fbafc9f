"""change_scheduler_policy and `trainops rollback` on the sandbox cluster: the regression job set
really runs in the shadow partition (its own node) before and after the change, trainops computes
the comparison, a change whose replay fails never reaches the target, an approved passing change
lands, and the rollback puts the partition back exactly as `scontrol` showed it before."""
from __future__ import annotations

import subprocess

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.changes.readback import partition_not_applied
from trainops.tools.changes.records import list_changes, read_change, save_change
from trainops.tools.changes.scheduler_policy import SETTINGS, _fail_and_roll_back, current_state, restore_commands
from trainops.tools.context import CallContext
from trainops.tools.governance import tokens
from trainops.tools.governance.gate import GateRefused

pytestmark = [pytest.mark.services, pytest.mark.slow]
runner = CliRunner()


def _partition(name: str) -> dict[str, str]:
    """Every field of `scontrol -o show partition NAME`, read here, not through the tool under test."""
    line = subprocess.run(["scontrol", "-o", "show", "partition", name], capture_output=True, text=True,
                          check=True).stdout.strip()
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def _approved(tool: str, payload: dict, approvers) -> str:
    """Queue the call (it arrives without a token); alice and bob sign it."""
    with pytest.raises(GateRefused) as queued:
        call(tool, payload, CallContext(actor="operator"))
    assert queued.value.reason == "approval_required" or queued.value.pending_id, queued.value
    token = tokens.approve(queued.value.pending_id, approvers.alice.key)
    return tokens.approve(queued.value.pending_id, approvers.bob.key, cosign=token)


def _policy(settings: dict) -> dict:
    return {"scope": "partition", "target": "sandbox", "settings": settings,
            "change": {"impact": "partition sandbox: every sandbox job"}}


def test_a_passing_change_lands_only_when_approved_and_rollback_restores_the_exact_partition(sandbox_cluster,
                                                                                             approvers):
    before_target, before_shadow = _partition("sandbox"), _partition("shadow")
    change = _policy({"PriorityTier": 7, "MaxTime": "02:00:00", "OverSubscribe": "NO"})
    with pytest.raises(GateRefused) as queued:  # no token: queued, nothing replayed, nothing changed
        call("change_scheduler_policy", change, CallContext(actor="operator"))
    assert _partition("sandbox") == before_target

    out = call("change_scheduler_policy", change,
               CallContext(actor="operator", approval_token=_approved("change_scheduler_policy", change, approvers)))

    comparison = out.comparison
    assert comparison.passed and comparison.reasons == [] and "queue wait" in comparison.rule
    for replay in (comparison.before, comparison.after):  # real jobs ran in the shadow partition
        assert replay.partition == "shadow" and replay.failures == 0 and replay.completed == len(replay.jobs) >= 4
        assert all(job.job_id and job.state == "COMPLETED" and job.run_s is not None for job in replay.jobs)
        assert replay.throughput_jobs_per_min > 0 and replay.mean_queue_wait_s is not None
        shown = subprocess.run(["scontrol", "-o", "show", "job", replay.jobs[0].job_id], capture_output=True,
                               text=True, check=True).stdout
        assert "Partition=shadow" in shown and "JobState=COMPLETED" in shown
    assert _partition("shadow") == before_shadow  # the replay's change on the shadow was undone

    now = _partition("sandbox")
    assert (now["PriorityTier"], now["MaxTime"], now["OverSubscribe"]) == ("7", "02:00:00", "NO")
    record = read_change(out.change_id)
    assert record.kind == "partition_policy" and record.target == "sandbox"
    assert {key: before_target[key] for key in SETTINGS} == {key: record.previous[key] for key in SETTINGS}
    assert record.applied["PriorityTier"] == "7" and record.evidence["comparison"]["passed"] is True
    assert record.approved_call == queued.value.pending_id  # the record links to the call the humans signed
    shown = runner.invoke(app, ["changes"], env={"COLUMNS": "200"}).output  # what a reviewer reads (A-OUT-4)
    assert "impact: partition sandbox: every sandbox job" in shown and "changed: " in shown and "PriorityTier" in shown
    assert "shadow replay on shadow: passed" in shown and "before: " in shown and "after: " in shown
    assert all(" ".join(argv) in shown for argv in record.rollback_commands), shown

    # a tampered copy (its restore command edited) is refused before anything runs or is queued
    forged = record.model_copy(update={"id": record.id[:-6] + "ffffff", "rollback_commands": [
        ["scontrol", "update", "PartitionName=sandbox", "AllowAccounts=nobody"]]})
    save_change(forged)
    refused = runner.invoke(app, ["rollback", forged.id])
    assert refused.exit_code == 2 and "edited" in refused.output, refused.output
    assert _partition("sandbox") == now

    pending = runner.invoke(app, ["rollback", record.id])  # gated: queued, says how to approve
    assert pending.exit_code == 2 and "trainops approve --pending" in pending.output, pending.output
    assert _partition("sandbox") == now
    rollback = {"change_id": record.id, "commands": record.rollback_commands}
    token = _approved("rollback_change", rollback, approvers)
    done = runner.invoke(app, ["rollback", record.id, "--approval-token", token, "--json"])
    assert done.exit_code == 0, done.output
    assert _partition("sandbox") == before_target  # field by field, every field scontrol shows
    assert read_change(record.id).rolled_back_at is not None
    again = runner.invoke(app, ["rollback", record.id])
    assert again.exit_code == 2 and "already rolled back" in again.output


def test_a_change_whose_shadow_replay_fails_is_refused_and_the_target_left_untouched(sandbox_cluster, approvers):
    before_target, before_shadow = _partition("sandbox"), _partition("shadow")
    for settings, failed in (({"AllowAccounts": "nobody"}, 4),  # no job's account may use the partition
                             ({"MaxTime": "1"}, 4),  # shorter than the jobs' 5 min: they never start
                             ({"MaxNodes": "1"}, 1)):  # the two-node job never starts
        change = _policy(settings)
        with pytest.raises(ToolError, match="R-SCH-1: the shadow replay") as refused:
            call("change_scheduler_policy", change,
                 CallContext(actor="operator", approval_token=_approved("change_scheduler_policy", change, approvers)))
        assert f"{failed} job(s) failed after the change" in str(refused.value)
        assert "left untouched" in str(refused.value)
        assert _partition("sandbox") == before_target and _partition("shadow") == before_shadow
    assert list_changes() == []


def test_a_setting_slurm_stores_otherwise_than_approved_never_lands(sandbox_cluster, approvers):
    """scontrol exits 0 for PreemptMode=GANG and stores OFF (no gang scheduling on this cluster): read back
    on the shadow, the change stops there with both fields named, and neither partition keeps it."""
    before_target, before_shadow = _partition("sandbox"), _partition("shadow")
    change = _policy({"PreemptMode": "GANG", "PriorityTier": 5})
    with pytest.raises(ToolError, match="did not store the approved settings on the shadow") as refused:
        call("change_scheduler_policy", change,
             CallContext(actor="operator", approval_token=_approved("change_scheduler_policy", change, approvers)))
    assert "PreemptMode approved GANG, Slurm shows 'OFF'" in str(refused.value)
    assert "PriorityTier" not in str(refused.value)  # stored as asked: not named
    assert _partition("sandbox") == before_target and _partition("shadow") == before_shadow
    assert list_changes() == []


def test_a_target_that_read_back_otherwise_is_rolled_back_and_the_error_says_so(sandbox_cluster):
    """The target's own read-back (a partition can differ from its shadow): what differed, the rollback,
    and the partition's read-back after it, all in the error."""
    previous = current_state("sandbox")
    subprocess.run(["scontrol", "update", "PartitionName=sandbox", "PreemptMode=GANG", "PriorityTier=9"], check=True)
    with pytest.raises(ToolError, match="FAILED: Slurm did not store what was approved") as failed:
        _fail_and_roll_back("sandbox", previous, restore_commands("sandbox", previous),
                            partition_not_applied({"PreemptMode": "GANG"}, current_state("sandbox")))
    assert "the partition reads back exactly as before" in str(failed.value)
    assert current_state("sandbox") == previous
