"""Recorded changes and the checks around change_scheduler_policy and rollback_change that need no
Slurm: the record's file, edited records and unsigned commands refused through the CLI and the
gate, bad partition settings named, no shadow partition named as a setting, the replay rule.
The real shadow replay and rollback are in tests/integration/test_shadow_queue.py."""
from __future__ import annotations

import time

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.changes.records import (
    ChangeRecord,
    list_changes,
    new_change_id,
    read_change,
    run_restore_command,
    save_change,
)
from trainops.tools.changes.scheduler_policy import (
    JobResult,
    Replay,
    compare_replays,
    restore_commands,
    shadow_partition,
)
from trainops.tools.context import CallContext
from trainops.tools.governance import queue

runner = CliRunner()
PREVIOUS = {"PriorityTier": "1", "MaxTime": "UNLIMITED", "MaxNodes": "UNLIMITED", "OverSubscribe": "NO",
            "PreemptMode": "OFF", "AllowAccounts": "ALL", "AllowQos": "ALL", "Nodes": "n[1-3]", "State": "UP"}


def _record(**update) -> ChangeRecord:
    record = ChangeRecord(id=new_change_id(), kind="partition_policy", target="gpu-a", previous=PREVIOUS,
                          applied={**PREVIOUS, "PriorityTier": "7"},
                          rollback_commands=restore_commands("gpu-a", PREVIOUS), time=time.time())
    return record.model_copy(update=update)


def test_a_record_round_trips_and_a_corrupt_one_names_its_file(workspace):
    record = _record()
    path = save_change(record)
    assert path == workspace / "changes" / f"{record.id}.json" and read_change(record.id) == record
    assert [r.id for r in list_changes()] == [record.id]
    path.write_text('{"id": "x"}')
    with pytest.raises(ValueError, match=rf"{path} is not a valid change record"):
        read_change(record.id)
    with pytest.raises(ValueError, match="is not valid: it looks like chg-"):
        read_change("../../etc/passwd")


def test_restore_commands_come_from_the_previous_state_alone():
    assert restore_commands("gpu-a", PREVIOUS) == [[
        "scontrol", "update", "PartitionName=gpu-a", "PriorityTier=1", "MaxTime=UNLIMITED", "MaxNodes=UNLIMITED",
        "OverSubscribe=NO", "PreemptMode=OFF", "AllowAccounts=ALL", "AllowQos=ALL"]]
    with pytest.raises(ValueError, match="AllowAccounts="):
        restore_commands("gpu-a", {**PREVIOUS, "AllowAccounts": "ALL State=DOWN"})


def test_an_edited_record_is_refused_by_trainops_rollback_before_it_is_queued():
    record = _record(rollback_commands=[["scontrol", "update", "PartitionName=gpu-a", "AllowAccounts=nobody"]])
    save_change(record)
    result = runner.invoke(app, ["rollback", record.id])
    assert result.exit_code == 2 and "the record was edited" in result.output, result.output
    assert queue.pending_calls() == []


def test_rollback_refuses_commands_other_than_the_records():
    record = _record()
    save_change(record)
    other = [["scontrol", "update", "PartitionName=gpu-a", "State=DOWN"]]
    with pytest.raises(ToolError, match="sign exactly these"):
        call("rollback_change", {"change_id": record.id, "commands": other}, CallContext(actor="operator"))
    assert queue.pending_calls() == []


def test_rollback_without_a_token_is_queued_and_says_how_to_approve():
    record = _record()
    save_change(record)
    result = runner.invoke(app, ["rollback", record.id])
    assert result.exit_code == 2 and "trainops approve --pending" in result.output, result.output
    assert "restore: scontrol update PartitionName=gpu-a PriorityTier=1" in result.output
    assert [item.tool for item in queue.pending_calls()] == ["rollback_change"]


def test_only_scontrol_and_sacctmgr_run_as_restore_commands():
    with pytest.raises(ToolError, match="is not a scontrol or sacctmgr command"):
        run_restore_command(["sh", "-c", "true"])


@pytest.mark.parametrize(("settings", "named"), [
    ({"preempt": "requeue"}, "settings.preempt is not a partition setting"),
    ({"MaxTime": "soon"}, "settings.MaxTime='soon' is not valid"),
    ({"PriorityTier": 70000}, "settings.PriorityTier=70000 is not valid"),
    ({"AllowAccounts": "acme State=DOWN"}, "settings.AllowAccounts="),
    ({"OverSubscribe": True}, "settings.OverSubscribe"),  # a bool is neither a string nor a number here
    ({}, "settings is empty"),
])
def test_bad_partition_settings_are_refused_naming_the_field(settings, named):
    policy = {"scope": "partition", "target": "gpu-a", "settings": settings, "change": {"impact": "gpu-a"}}
    with pytest.raises(ToolError, match=named.replace(".", r"\.").replace("(", r"\(")):
        call("change_scheduler_policy", policy, CallContext(actor="operator"))
    assert queue.pending_calls() == []


def test_without_a_shadow_partition_the_refusal_names_the_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.setenv("TRAINOPS_CONFIG", str(tmp_path / "config.toml"))
    with pytest.raises(ToolError, match=r"\[scheduler\] shadow_partition"):
        shadow_partition()
    (tmp_path / "config.toml").write_text('[scheduler]\nshadow_partition = "gpu-shadow"\n')
    assert shadow_partition() == "gpu-shadow"


def _replay(states: list[str], wait_s: float = 2.0, span_s: float = 60.0) -> Replay:
    jobs = [JobResult(name=f"j{i}", job_id=str(i), state=state, queue_wait_s=wait_s if state == "COMPLETED" else None)
            for i, state in enumerate(states)]
    completed = states.count("COMPLETED")
    return Replay(partition="shadow", jobs=jobs, completed=completed, failures=len(states) - completed,
                  mean_queue_wait_s=wait_s if completed else None, span_s=span_s,
                  throughput_jobs_per_min=completed * 60 / span_s)


def test_the_replay_rule_fails_on_failures_longer_waits_and_lost_throughput():
    baseline = _replay(["COMPLETED"] * 3)
    assert compare_replays(baseline, _replay(["COMPLETED"] * 3, wait_s=20)).passed
    failed = compare_replays(baseline, _replay(["COMPLETED", "REJECTED", "TIMEOUT"]))
    assert not failed.passed and "2 job(s) failed after the change" in failed.reasons[0]
    assert not compare_replays(baseline, _replay(["COMPLETED"] * 3, wait_s=40)).passed
    assert not compare_replays(baseline, _replay(["COMPLETED"] * 3, span_s=200)).passed
    assert "baseline replay itself failed" in compare_replays(_replay(["FAILED"]), baseline).reasons[0]


def test_a_hand_written_record_is_no_change_at_all_even_when_its_commands_match_its_state(workspace):
    """Issue 41 class 1: a record file trainops did not write (here: a copy of a real one whose 'previous
    state' claims more, its restore commands regenerated to match) is refused by `trainops rollback`
    before anyone is asked to sign, and `trainops changes` does not list it."""
    real = _record()
    save_change(real)
    claimed = {**PREVIOUS, "AllowAccounts": "admins", "MaxNodes": "1"}
    forged = real.model_copy(update={"id": new_change_id(), "previous": claimed,
                                     "rollback_commands": restore_commands("gpu-a", claimed)})
    (workspace / "changes" / f"{forged.id}.json").write_text(forged.model_dump_json())
    edited = real.model_copy(update={"previous": claimed, "rollback_commands": restore_commands("gpu-a", claimed)})
    (workspace / "changes" / f"{real.id}.json").write_text(edited.model_dump_json())
    for change in (forged.id, real.id):
        result = runner.invoke(app, ["rollback", change])
        assert result.exit_code == 2 and "is not a change trainops recorded" in result.output, result.output
    assert queue.pending_calls() == [] and list_changes() == []


def test_trainops_changes_shows_a_reviewer_the_impact_the_shadow_result_and_the_rollback(workspace):
    """A-OUT-4 without --json: what the change did field by field, who it affects, how the shadow replay
    went (and why it failed), and the exact commands `trainops rollback` would run."""
    failed = compare_replays(_replay(["COMPLETED"] * 3, wait_s=1.0),
                             _replay(["COMPLETED", "FAILED", "COMPLETED"], wait_s=1.0))
    save_change(_record(evidence={"impact": "tenants a and b queue behind priority-tier 7 jobs on gpu-a",
                                  "shadow_partition": "shadow", "comparison": failed.model_dump()}))
    quota = _record(kind="tenant_quota", target="acme", previous={"GrpTRES": "cpu=4"},
                    applied={"GrpTRES": "cpu=8"}, rollback_commands=[["sacctmgr", "-i", "modify", "qos", "acme",
                                                                      "set", "GrpTRES=cpu=4"]],
                    evidence={"reason": "acme's sweep needs 8 CPUs this week"})
    save_change(quota)
    result = runner.invoke(app, ["changes"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "impact: tenants a and b queue behind priority-tier 7 jobs on gpu-a" in text
    assert "changed: PriorityTier 1 -> 7" in text
    assert "shadow replay on shadow: failed" in text and "1 job(s) failed after the change" in text
    assert "before: 3 completed, 0 failed, mean queue wait 1.0 s" in text
    assert "scontrol update PartitionName=gpu-a" in text and "trainops rollback" in text
    assert "reason: acme's sweep needs 8 CPUs this week" in text and "changed: GrpTRES cpu=4 -> cpu=8" in text
    assert "sacctmgr -i modify qos acme set GrpTRES=cpu=4" in text
    assert "shadow replay: none (a quota is checked by reading Slurm's accounting back)" in text
