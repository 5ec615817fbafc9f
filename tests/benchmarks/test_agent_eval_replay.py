"""Recorder and replay: a real drill's workspace, frozen into a scenario and served by the replay
scheduler and monitor, answers every read tool byte for byte as the live workspace did (the
clock stopped at the recording, as the replay stops it); a mutation reaches no live backend and
is written down with the gate's decision."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from trainops.benchmarks.agent_eval import replay as replay_backends
from trainops.benchmarks.agent_eval.recorder import record
from trainops.benchmarks.agent_eval.replay import replaying
from trainops.benchmarks.agent_eval.scenario import Expected, Scenario, load, materialize
from trainops.skills.drill.drill import drill
from trainops.skills.request import JobRequest
from trainops.tools.calls import call
from trainops.tools.monitoring import embedded

pytestmark = pytest.mark.usefixtures("as_operator")

DRILL_JOB = ["training.steps=12", "training.seq_len=64", "training.global_batch=8", "training.micro_batch=4",
             "checkpoint.enable=true", "checkpoint.interval=2", "checkpoint.mode=async", "checkpoint.keep=50"]
SCENARIO = Scenario(name="crash-live", request="What happened to the job?", tags=["easy", "crash"],
                    recorded_from="crash drill", expected=Expected(verdict="diagnosed", fault_kind="crash"))


class StoppedClock:
    def __init__(self, now: float):
        self.now = now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


def read_tool_calls(job_id: str, run_dir: str) -> list[tuple[str, dict]]:
    """Every read tool over the scheduler, the monitor and the run folder (the log tools included), with the
    arguments an agent gives."""
    calls: list[tuple[str, dict]] = [("list_jobs", {}), ("list_nodes", {}), ("job_status", {"job_id": job_id}),
                                     ("wait_job", {"job_id": job_id, "timeout_s": 1}),
                                     ("job_logs", {"job_id": job_id}), ("job_logs", {"job_id": job_id, "tail": 0}),
                                     ("summarize_run", {"run": run_dir}), ("list_checkpoints", {"run": run_dir}),
                                     ("list_interruptions", {}), ("list_interruptions", {"job_id": job_id}),
                                     ("effective_training_time", {"job_id": job_id})]
    calls += [("job_logs", {"job_id": job_id, "rank": rank, "tail": 20}) for rank in (0, 1)]
    calls += [("grep_log", {"job_id": job_id, "pattern": "step|error"}),  # the bounded log tools
              ("grep_log", {"job_id": job_id, "rank": 0, "pattern": "STEP", "ignore_case": True, "max_matches": 3}),
              ("grep_log", {"run": run_dir, "rank": 0, "pattern": "loaded checkpoint", "max_bytes": 200}),
              ("read_log_window", {"job_id": job_id, "line": 5, "before": 2, "after": 3}),
              ("read_log_window", {"run": run_dir, "rank": 0, "line": 1, "after": 10, "max_bytes": 300})]
    for metric in ("loss", "step_time_s", "heartbeat_age_s", "mfu_pct_avg", "step_time_spread_s"):
        calls.append(("query_metrics", {"run": run_dir, "metric": metric}))
        calls.append(("query_metrics", {"run": run_dir, "metric": metric, "mode": "series", "window_s": 1e9}))
    calls.append(("query_metrics", {"run": run_dir, "metric": "step_time_s", "per_node": "max"}))
    calls.append(("query_metrics", {"run": run_dir, "metric": "loss", "rank": 1, "mode": "series", "window_s": 5}))
    return calls


def answers(calls: list[tuple[str, dict]]) -> list[str]:
    out = []
    for name, args in calls:
        try:
            out.append(call(name, args).model_dump_json())
        except Exception as exc:  # an error is an answer too, and must replay the same
            out.append(f"{type(exc).__name__}: {exc}")
    return out


@pytest.mark.slow
def test_a_recorded_drill_replays_every_read_tool_byte_for_byte(workspace, tmp_path, monkeypatch):
    result, _ = drill(JobRequest(overrides=DRILL_JOB, timeout_s=300), "crash")
    run_dir = result.run_dir
    job_id = json.loads((workspace / "interruptions.jsonl").read_text().splitlines()[0])["job_id"]
    calls = read_tool_calls(job_id, run_dir)

    with monkeypatch.context() as stopped:  # the live answers and the capture, at one instant
        clock = StoppedClock(embedded.time.time())
        stopped.setattr(embedded, "time", clock)
        stopped.setattr(replay_backends, "time", clock)
        live = answers(calls)
        folder = record(workspace, SCENARIO, tmp_path / "scenarios")
    logged = [json.loads(a) for (name, _), a in zip(calls, live, strict=True)
              if name in ("grep_log", "read_log_window")]
    assert all(out.get("matches") or out.get("lines") for out in logged), logged  # each found lines: none is an error
    assert not any("checkpoints" in p.parts and p.name != "COMMIT.json"
                   for p in (folder / "workspace").rglob("*") if p.is_file())
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) < 200_000

    live_record = (workspace / "jobs" / f"{job_id}.json").read_text()
    shutil.move(workspace, tmp_path / "live-workspace")  # the live run is gone: only the scenario answers
    home = materialize(load(folder), workspace)
    with replaying(home) as replay:
        replayed = answers(calls)
        assert [(name, a, b) for (name, _), a, b in zip(calls, live, replayed, strict=True) if a != b] == []
        cancelled = call("cancel_job", {"job_id": job_id})
    assert cancelled.state == "completed"  # nothing ran: the recorded state stands
    [mutation] = replay.mutations()
    assert (mutation["verb"], mutation["args"]["job_id"]) == ("cancel", job_id)
    assert (mutation["gate"]["decision"], mutation["gate"]["actor"], mutation["gate"]["approver"]) == (
        "allowed", "operator", None)  # the operator needs no approval by default
    assert (tmp_path / "live-workspace" / "jobs" / f"{job_id}.json").read_text() == live_record
