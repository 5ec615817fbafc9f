"""Issue 25's closing test: a series of failing runs in one workspace in which effective training
time falls across consecutive windows ends in an R-ESC-1 item for a human, with the cause split
the interruption record holds, on the SOP's pack path (skills/escalate.carry_fired, refused
without it) and on the watch of a running job (`trainops watch`), both reading one record view.

The runs are real local-scheduler jobs (a few lines of Python standing in for the ranks) whose
ends the job-status path records. Timing, with the ETTR window W = 3 s: the first job fails at
once; the second trains ~7 s (a checkpoint committed each step, so nothing is redone) and then
stalls 6.6 s before it fails. The stall is the only long loss and it ends the record; with the
time until the readings it lasts between 2W and 3W, so the last three closed windows read a fall
(100 then lower then 0, or partial then 0 then 0) whatever the windows' phase."""
from __future__ import annotations

import json
import sys
import time

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.skills.escalate import carry_fired, record_ettr
from trainops.skills.evidence.model import BaselineSummary, MetricSpread, PackEnvironment
from trainops.skills.evidence.pack import PackRefused, assemble, write
from trainops.skills.planning import reliability_summary
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.governance import queue
from trainops.tools.governance.escalation import ettr_falling
from trainops.tools.reliability.interruptions import cause_distribution, read_interruptions

pytestmark = [pytest.mark.usefixtures("as_operator"), pytest.mark.slow]
OPERATOR = CallContext(actor="operator")
WINDOW_S = 3.0

RANK = r"""
import json, os, sys, time
run_dir, mode, steps, stall_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
os.makedirs(f"{run_dir}/heartbeat", exist_ok=True)
os.makedirs(f"{run_dir}/logs", exist_ok=True)
beat = {"pid": os.getpid(), "host": "node-a"}
for step in range(1, steps + 1):
    t = time.time()
    time.sleep(0.25)
    now = time.time()
    with open(f"{run_dir}/metrics.jsonl", "a") as fh:
        for rank in (0, 1):  # two replicas' parameter checksums; in "checksum" mode replica 1 differs
            bad = mode == "checksum" and rank == 1 and step == steps
            fh.write(json.dumps({"step": step, "rank": rank, "loss": 1.0, "step_time_s": now - t, "time": now,
                                 "param_checksum": 2.0 if bad else 1.0, "replica_group": "dp0"}) + "\n")
    if mode == "raise":
        with open(f"{run_dir}/checkpoints.jsonl", "a") as fh:
            fh.write(json.dumps({"event": "save", "step": step, "time": now, "stall_s": 0.001}) + "\n")
    beat.update(step=step, time=now)
    with open(f"{run_dir}/heartbeat/rank0.json", "w") as fh:
        json.dump(beat, fh)
time.sleep(stall_s)  # stalled: no step and no beat until the error ends it
err = "ValueError: batch has no tokens" if mode == "raise" else "replica checksums disagree"
beat["exit"] = {"time": time.time(), "error": err}
with open(f"{run_dir}/logs/rank0.log", "w") as fh:
    fh.write(("Traceback (most recent call last):\n" if mode == "raise" else "") + err + "\n")
with open(f"{run_dir}/heartbeat/rank0.json", "w") as fh:
    json.dump(beat, fh)
sys.exit(1)
"""


def submit(workspace, name: str, mode: str, steps: int, stall_s: float = 0.0) -> str:
    run_dir = workspace / "runs" / name
    run_dir.mkdir(parents=True)
    spec = {"name": name, "command": [sys.executable, "-c", RANK, str(run_dir), mode, str(steps), str(stall_s)],
            "run_dir": str(run_dir)}
    return call("submit_job", {"spec": spec}, OPERATOR).handle.job_id


def fail_and_wait(workspace, name: str, mode: str, steps: int, stall_s: float = 0.0) -> str:
    job = submit(workspace, name, mode, steps, stall_s)
    call("wait_job", {"job_id": job, "timeout_s": 60}, OPERATOR)
    return job


def pack_with_reliability(pack_id: str, run_dirs: list[str]):
    """A pack whose S2 block is the SOP's (skills/planning.reliability_summary), as `sop.run` builds it."""
    spread = MetricSpread(median=2.0, low=1.9, high=2.1, spread_pct=10.0)
    base = BaselineSummary(model="tiny", parallel_layout="dp_shard=2", precision="fp32", repeats=3,
                           warmup_steps_excluded=2, step_time_s=spread, tokens_per_s=spread, mfu_pct=spread,
                           peak_source="measured GEMM", data_wait_share_pct=10.0, run_dirs=run_dirs,
                           reliability=reliability_summary(24.0, WINDOW_S))
    env = PackEnvironment(framework="trainops-trainer", framework_version="0.1.0", torch_version="2.13.0",
                          hardware="cpu:x86_64", device_count=2, backend="gloo", scheduler="local")
    return assemble(pack_id, env, base, [], [], [])


def test_a_falling_series_ends_in_an_r_esc_1_item_with_the_records_cause_split(workspace):
    first = fail_and_wait(workspace, "sdc", "checksum", 4)
    second = fail_and_wait(workspace, "stall", "raise", 28, stall_s=6.6)
    watched = submit(workspace, "live", "run", 400)
    pack = pack_with_reliability("falling", [str(workspace / "runs" / "stall")])
    watch = CliRunner().invoke(app, ["watch", watched, "--ettr-window", str(WINDOW_S), "--interval", "0.2",
                                     "--timeout", "20", "--json"])
    call("cancel_job", {"job_id": watched}, OPERATOR)

    records = {r.job_id: r for r in read_interruptions() if r.job_id in (first, second)}
    assert records[first].cause == "hardware" and "checksums disagree" in records[first].cause_reason
    assert records[second].cause == "software" and "ValueError" in records[second].cause_reason
    causes = cause_distribution(list(records.values()))
    series, split = record_ettr(until=pack.created_time, window_s=WINDOW_S)
    assert ettr_falling(series), series
    assert split == causes and pack.baseline.reliability.ettr_pct == series

    with pytest.raises(PackRefused, match="R-ESC-1: the pack's evidence fires it"):
        write(pack)
    carried = carry_fired(pack)
    (item,) = [i for i in carried.awaiting_human if i.startswith("R-ESC-1 escalate_interruption_causes")]
    assert "causes " + ", ".join(f"{k} {v}" for k, v in causes.items()) in item
    pending = queue.get_pending(item.split("pending approval ")[1].rstrip("]"))
    assert pending.tool == "acknowledge_escalation" and pending.input["cause_distribution"] == causes
    report = (write(carried) / "report.md").read_text()
    assert "**Reliability**" in report and "Interruption rate " in report and "MTBF " in report  # figures quoted
    assert "measured from 2 recorded interruptions" in report

    assert watch.exit_code == 3, watch.output  # a rule fired and went to a human
    out = json.loads(watch.stdout)
    fired = [e for e in out["watch"]["fired"] if e["rule_id"] == "R-ESC-1"]
    assert fired and fired[0]["cause_distribution"] == causes, out["watch"]
    history = out["watch"]["signals"]["ettr_history_pct"]
    n = min(len(history), len(series)) - 1  # the windows both closed read the same record alike
    assert n >= 2 and history[:n] == series[:n]
    assert any(line.startswith("R-ESC-1") for line in out["handed_to_human"])


def test_s2_states_the_declared_mtbf_when_the_record_is_too_short(workspace):
    assert reliability_summary(24.0, WINDOW_S).mtbf_source.startswith("declared")
    fail_and_wait(workspace, "once", "raise", 2)
    rel = reliability_summary(12.0, WINDOW_S)
    assert (rel.unplanned, rel.mtbf_h, rel.mtbf_measured, rel.interruption_rate_per_day) == (1, 12.0, False, None)
    assert rel.recovery_time_s is not None and rel.cause_distribution["software"] == 1
    pack = pack_with_reliability(f"short-{time.time_ns()}", [str(workspace / "runs" / "once")])
    report = (write(pack) / "report.md").read_text()
    assert "the declared figure, not measured" in report and "Interruption rate not measured" in report
