"""R-ESC-1..4 are evaluated where the evidence is made, not only in tests: a fired rule becomes a
pending approval with the record's cause split, a pack that fires a rule it does not carry is
refused, and `trainops watch` evaluates the rules on a live job until it ends or one fires."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.skills import rollout
from trainops.skills.escalate import carry_fired, human_items
from trainops.skills.evidence.model import AblationRow, LadderStop, PackEnvironment
from trainops.skills.evidence.pack import PackRefused, assemble, write
from trainops.tools.calls import call
from trainops.tools.governance import queue
from trainops.tools.governance.escalation import EscalationSignals, escalations_for, ettr_falling

pytestmark = pytest.mark.usefixtures("as_operator")


@pytest.mark.parametrize("readings, falls", [
    ([95, 60, 61], True),  # the uptick does not undo the fall
    ([95.0, 93.0, 90.5], True),
    ([90.0, 91.2, 89.4, 90.6, 89.8, 90.9], False),  # flat and noisy within the tolerance
    ([95, 60, 95], False),  # recovered
    ([60, 61, 95], False),
    ([95, 60], False),  # too few windows to call a trend
])
def test_readings_95_60_61_fire_and_a_flat_noisy_series_does_not(readings, falls):
    assert ettr_falling(readings) is falls


def test_a_fired_rule_is_queued_for_a_human_with_the_cause_split(workspace):
    signals = EscalationSignals(ettr_history_pct=[95, 60, 61], checkpoint_save_s=600, mtbf_s=24 * 3600)
    fired = escalations_for(signals, {"hardware": 2, "network": 1, "software": 0, "data": 0, "unclassified": 1})
    assert [e.rule_id for e in fired] == ["R-ESC-1", "R-ESC-4"]
    items = human_items(fired, "job 7")
    pending = [queue.get_pending(item.split("pending approval ")[1].rstrip("]")) for item in items]
    assert [p.tool for p in pending] == ["acknowledge_escalation"] * 2
    assert pending[0].input["cause_distribution"]["hardware"] == 2 and "95.0% -> 60.0% -> 61.0%" in items[0]
    assert "11.8%" in pending[1].input["detail"]  # the one threshold (checkpoint_interval.CHECKPOINT_TOO_SLOW)


def test_a_pack_whose_arm_vanished_at_scale_is_refused_unless_it_carries_the_escalation(workspace):
    row = AblationRow(knob="parallel.tp", value="2", baseline_value="1", category="parallelism", scale="8 procs",
                      scale_kind="target", mfu_change_pct=-0.5, noise_band_pct=2.0, beyond_noise=False,
                      verdict="within-noise", vanished_at_scale=True, source_run="runs/arm-2",
                      baseline_run="runs/base-2")
    env = PackEnvironment(framework="trainops-trainer", framework_version="0.1.0", torch_version="2.13.0",
                          hardware="cpu:x86_64", device_count=2, backend="gloo", scheduler="local")
    pack = assemble("vanished", env, None, [row], [], [])
    with pytest.raises(PackRefused, match="R-ESC-2: the pack's evidence fires it"):
        write(pack)
    carried = carry_fired(pack)
    assert any(item.startswith("R-ESC-2 stop_rollout_and_roll_back") for item in carried.awaiting_human)
    assert (write(carried) / "evidence.json").is_file()


def test_a_ladder_stop_already_handed_over_is_carried_not_queued_twice(workspace):
    row = AblationRow(knob="parallel.tp", value="2", baseline_value="1", category="parallelism", scale="2 procs",
                      scale_kind="target", mfu_change_pct=-4.0, noise_band_pct=2.0, beyond_noise=True,
                      verdict="regression", vanished_at_scale=True, source_run="runs/arm-2",
                      baseline_run="runs/base-2")
    stop = LadderStop(rung="2 processes", reason="gain gone", topology_hint="the first collectives",
                      reverted_to="1", verification_change_pct=0.3, verification_band_pct=2.0,
                      verification_matches=True)
    stop = stop.model_copy(update={"human_item": rollout.hand_over(row, stop)})
    row = row.model_copy(update={"stop": stop})
    env = PackEnvironment(framework="trainops-trainer", framework_version="0.1.0", torch_version="2.13.0",
                          hardware="cpu:x86_64", device_count=2, backend="gloo", scheduler="local")
    carried = carry_fired(assemble("ladder", env, None, [row], [], []))
    assert [i for i in carried.awaiting_human if i.startswith("R-ESC")] == [stop.human_item]  # the ladder's, once
    assert [p.tool for p in queue.pending_calls()] == ["acknowledge_escalation"]
    assert (write(carried) / "evidence.json").is_file()


def test_watch_on_an_unknown_job_says_so_in_one_line(workspace):
    result = CliRunner().invoke(app, ["watch", "no-such-job", "--json"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "unknown job id 'no-such-job'" in json.loads(result.stdout)["error"]


@pytest.mark.slow
def test_watch_ends_with_the_jobs_state_when_nothing_fires(workspace):
    out = call("submit_job", {"training": {"preset": "tiny", "nproc": 2,
                                           "overrides": ["training.steps=6", "data.kind=synthetic"]}})
    result = CliRunner().invoke(app, ["watch", out.handle.job_id, "--interval", "0.2", "--json"])
    assert result.exit_code == 0, result.output
    watched = json.loads(result.stdout)["watch"]
    assert (watched["ended"], watched["state"], watched["fired"]) == (True, "completed", [])


@pytest.mark.slow
def test_watch_on_a_live_bit_flip_escalates_the_suspected_sdc_and_runs_the_node_tests(workspace):
    out = call("submit_job", {"training": {"preset": "tiny", "nproc": 2, "overrides": [
        "training.steps=200", "data.kind=synthetic", "parallel.data_parallel=ddp", "checkpoint.enable=true",
        "checkpoint.interval=2", "faults.bitflip_step=4", "faults.bitflip_rank=1"]}})
    result = CliRunner().invoke(app, ["watch", out.handle.job_id, "--interval", "0.2", "--json"])
    assert result.exit_code == 3, result.output
    body = json.loads(result.stdout)
    assert [e["rule_id"] for e in body["watch"]["fired"]] == ["R-ESC-3"]
    assert body["watch"]["suspect"]["step"] == 4 and "checksum_mismatch" in body["watch"]["suspect"]["evidence"]
    assert "fleet test job" in body["handed_to_human"][0] and "pending approval" in body["handed_to_human"][0]
    status = call("job_status", {"job_id": out.handle.job_id})
    assert status.state in ("cancelled", "failed")  # stopped: its node was tested
