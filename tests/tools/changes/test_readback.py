"""The read-back after a Slurm change compares each approved field in the one form Slurm shows it.
The forms below are what Slurm 22.05 showed for each input in the sandbox (scontrol update, then
scontrol -o show partition): equal forms must compare equal, and a value Slurm stored otherwise than
asked (FORCE:0 as EXCLUSIVE, GANG as OFF, REQUEUE,GANG as REQUEUE) must not."""
from __future__ import annotations

import pytest

from trainops.tools.changes.readback import partition_not_applied, quota_not_applied
from trainops.tools.changes.scheduler_policy import PolicyInput


@pytest.mark.parametrize(("asked", "shown"), [
    ({"MaxTime": "60"}, {"MaxTime": "01:00:00"}), ({"MaxTime": "1-0"}, {"MaxTime": "1-00:00:00"}),
    ({"MaxTime": "2:30"}, {"MaxTime": "00:03:00"}), ({"MaxTime": "INFINITE"}, {"MaxTime": "UNLIMITED"}),
    ({"MaxTime": "1440"}, {"MaxTime": "1-00:00:00"}), ({"OverSubscribe": "FORCE"}, {"OverSubscribe": "FORCE:4"}),
    ({"OverSubscribe": "yes"}, {"OverSubscribe": "YES:4"}),
    ({"OverSubscribe": "force:2"}, {"OverSubscribe": "FORCE:2"}),
    ({"MaxNodes": "INFINITE"}, {"MaxNodes": "UNLIMITED"}), ({"AllowAccounts": "b,a"}, {"AllowAccounts": "a,b"}),
    ({"PreemptMode": "requeue"}, {"PreemptMode": "REQUEUE"}), ({"PriorityTier": 7}, {"PriorityTier": "7"}),
])
def test_what_slurm_shows_for_what_was_asked_reads_as_applied(asked, shown):
    assert partition_not_applied(asked, shown) == []


@pytest.mark.parametrize(("asked", "shown"), [
    ({"OverSubscribe": "FORCE:0"}, {"OverSubscribe": "EXCLUSIVE"}), ({"PreemptMode": "GANG"}, {"PreemptMode": "OFF"}),
    ({"PreemptMode": "REQUEUE,GANG"}, {"PreemptMode": "REQUEUE"}), ({"MaxTime": "61"}, {"MaxTime": "01:00:00"}),
    ({"MaxNodes": "4"}, {"MaxNodes": "1"}), ({"AllowAccounts": "a,b"}, {"AllowAccounts": "a"}),
    ({"PriorityTier": 7}, {}), ({"MaxTime": "1:00:00"}, {"MaxTime": "garbage"}),
])
def test_a_value_slurm_stored_otherwise_is_named_as_not_applied(asked, shown):
    missed = partition_not_applied(asked, shown)
    key = next(iter(asked))
    assert len(missed) == 1 and missed[0].startswith(f"{key} approved {asked[key]}, Slurm shows")


def test_a_quota_sacctmgr_did_not_store_is_named_field_by_field():
    approved = {"account": True, "qos": True, "account_qos": ["acme"], "default_qos": "acme", "users": ["root"],
                "grp_tres": {"cpu": 4}, "grp_jobs": 2, "priority": 100}
    shown = {**approved, "users": ["alice", "root"], "account_record": True}
    assert quota_not_applied(approved, shown) == []
    wrapped = {**shown, "grp_jobs": 0, "grp_tres": {}, "users": ["alice"]}
    missed = quota_not_applied(approved, wrapped)
    assert [m.split(" ")[0] for m in missed] == ["users", "grp_tres", "grp_jobs"]
    assert "grp_jobs approved 2, sacctmgr shows 0" in missed


@pytest.mark.parametrize("value", ["FORCE:0", "YES:00", "force:0"])
def test_oversubscribe_with_no_jobs_is_refused_before_anyone_signs(value):
    with pytest.raises(ValueError, match="Slurm stores FORCE:0 as EXCLUSIVE"):
        PolicyInput(scope="partition", target="p", settings={"OverSubscribe": value},
                    change={"impact": "partition p: every job"})
