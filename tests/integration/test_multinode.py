"""Multi-node training for real: the embedded trainer runs FSDP2 and DDP across two namespace nodes of
a `trainops sandbox` Slurm cluster (srun + torchrun, c10d rendezvous on the first node, gloo bound to
each node's own interface), and every rank's heartbeat and metrics reach the shared run folder."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trainops.run_records import read_recoveries
from trainops.skills.drill.drill import drill
from trainops.skills.request import JobRequest
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.reliability.interruptions import read_interruptions
from trainops.tools.sandbox.cluster import node_states
from trainops.tools.sandbox.metrics import EXPORTER_PORT_BASE, prometheus_url

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.usefixtures("as_operator")]
OPERATOR = CallContext(actor="operator")


def _train_on_two_nodes(extra: list[str]) -> tuple[dict, Path]:
    out = call("submit_job", {"scheduler": "slurm", "name": "multinode", "training": {
        "preset": "tiny", "nproc": 1, "nodes": 2,
        "overrides": ["training.steps=6", "data.kind=synthetic", *extra]}}, OPERATOR)
    job_id = out.handle.job_id
    deadline = time.monotonic() + 180
    while True:
        status = call("job_status", {"scheduler": "slurm", "job_id": job_id}, OPERATOR)
        if status.state in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    logs = call("job_logs", {"scheduler": "slurm", "job_id": job_id, "tail": 40}, OPERATOR).text
    assert status.state == "completed", f"{status.state} ({status.reason}):\n{logs}"
    return status.model_dump(), Path(out.handle.run_dir)


@pytest.mark.parametrize("data_parallel", ["fsdp", "ddp"])
def test_the_trainer_runs_across_two_nodes_and_every_rank_reports_to_the_run_folder(sandbox_cluster, data_parallel):
    status, run_dir = _train_on_two_nodes([f"parallel.data_parallel={data_parallel}"])
    assert status["nodes"] == ["n1", "n2"]
    hosts = {json.loads(p.read_text())["host"] for p in (run_dir / "heartbeat").glob("rank*.json")}
    assert hosts == {"n1", "n2"}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["rank"] for r in records} == {0, 1}
    assert max(r["step"] for r in records) == 6
    final = json.loads((run_dir / "status.json").read_text())
    assert final["status"] == "ok"


def _submit_long_run(steps: int = 400, extra: tuple[str, ...] | list[str] = ()) -> tuple[str, Path]:
    out = call("submit_job", {"scheduler": "slurm", "name": "nodefault", "training": {
        "preset": "tiny", "nproc": 1, "nodes": 2,
        "overrides": [f"training.steps={steps}", "data.kind=synthetic", "checkpoint.enable=true",
                      "checkpoint.interval=5", *extra]}}, OPERATOR)
    run_dir = Path(out.handle.run_dir)
    deadline = time.monotonic() + 120
    while not _steps_done(run_dir) >= 3:
        assert time.monotonic() < deadline, "the two-node run never reached step 3"
        time.sleep(0.2)
    return out.handle.job_id, run_dir


def _steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return max((json.loads(line)["step"] for line in lines if line.strip()), default=0)


@pytest.mark.parametrize("kind", ["node_crash", "power_loss"])
def test_a_crashed_node_is_detected_from_the_job_first_and_slurm_confirms_it(sandbox_cluster, kind):
    job_id, run_dir = _submit_long_run()
    fault = call("inject_fault", {"kind": kind, "node": "n2", "run": run_dir.name}, OPERATOR)
    assert fault.pids, "the node's slurmd and job processes were killed"
    found = call("detect_faults", {"run": run_dir.name, "job_id": job_id, "scheduler": "slurm",
                                   "heartbeat_stale_s": 2.0, "timeout_s": 60}, OPERATOR)
    assert found.detected, found
    assert found.detection_latency_s is not None and found.detection_latency_s < 10
    deadline = time.monotonic() + 60
    while not node_states(sandbox_cluster)["n2"].startswith(("down", "idle*", "mixed*", "allocated*")):
        assert time.monotonic() < deadline, f"Slurm never marked n2 unreachable: {node_states(sandbox_cluster)}"
        time.sleep(0.5)
    call("cancel_job", {"scheduler": "slurm", "job_id": job_id, "force": True}, OPERATOR)
    call("inject_fault", {"kind": "heal_node", "node": "n2"}, OPERATOR)


def test_node_faults_act_only_on_a_trainops_sandbox(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    with pytest.raises(ToolError, match="acts on trainops sandbox nodes only"):
        call("inject_fault", {"kind": "node_crash", "node": "n1"}, OPERATOR)
    with pytest.raises(ToolError, match="needs node: a sandbox node name"):
        call("inject_fault", {"kind": "partition", "node": "login-1"}, OPERATOR)


def test_a_node_crash_drill_detects_drains_and_recovers_on_the_hot_spare(sandbox_cluster):
    req = JobRequest(preset="tiny", nproc=1, nodes=2, scheduler="slurm", timeout_s=240,
                     overrides=["training.steps=60", "data.kind=synthetic", "checkpoint.enable=true",
                                "checkpoint.interval=3"])
    result, row = drill(req, "node-crash", inject_step=4, ctx=OPERATOR)
    assert result.isolation_granularity == "node"
    assert "node n2 lost (ran on n1, n2), restarted on n1, n3" in result.detector
    assert "drained n2" in result.detector
    assert result.detection_latency_s < 10 and result.recovery_time_s > 0
    assert result.async_checkpoint_intact
    assert "--scheduler slurm --nodes 2" in row.command

    rec = next(r for r in read_interruptions() if r.id == result.interruption_id)  # the cause is the record's
    assert (rec.cause, result.cause) == ("hardware", "hardware") and "node down: n2" in rec.cause_reason, rec

    deadline = time.monotonic() + 60
    while node_states(sandbox_cluster)["n2"] != "idle":  # healed and resumed by the drill
        assert time.monotonic() < deadline, node_states(sandbox_cluster)
        time.sleep(0.5)


def test_with_a_spare_node_a_node_crash_moves_its_ranks_onto_warm_spares_without_a_requeue(sandbox_cluster):
    """In-process restart across nodes: the job holds n3 as its spare node; when n2 crashes, its
    rank moves onto n3's warm spare, the job keeps its id (nothing cancelled or requeued) and
    completes, and Slurm's own verdict on n2 comes after the job is already training again."""
    req = JobRequest(preset="tiny", nproc=1, nodes=2, scheduler="slurm", timeout_s=240,
                     overrides=["training.steps=40", "data.kind=synthetic", "checkpoint.enable=true",
                                "checkpoint.interval=3", "resilience.in_process_restart=true",
                                "resilience.spare_nodes=1", "resilience.warm_spares=0",
                                "resilience.collective_timeout_s=10"])
    result, _ = drill(req, "node-crash", inject_step=4, ctx=OPERATOR)
    assert result.recovery_path == "spare-admitted" and result.isolation_granularity == "node"
    assert "n2 replaced by n3 in process" in result.detector and "Slurm confirmed n2 not responding" in result.detector
    [entry] = read_recoveries(result.run_dir)
    assert entry.lost_nodes == ["n2"] and entry.admitted_on == {1: "n3"} and entry.lost[0].host == "n2"
    assert result.recovery_time_s < 5 and set(result.recovery_phases_s) == {"detect", "abort", "admit", "load",
                                                                              "first_step"}
    status = call("job_status", {"scheduler": "slurm", "job_id": result.job_id}, OPERATOR)
    assert status.state == "completed"  # under --no-kill Slurm shrank the job instead of requeueing it
    [rec] = [r for r in read_interruptions() if r.run_dir == result.run_dir]  # the job's own end was clean
    assert rec.id == result.interruption_id and rec.cause == "hardware" and rec.id.endswith("#gen1"), rec


def test_the_sandboxs_prometheus_scrapes_every_node_and_query_metrics_folds_per_node(sandbox_cluster, monkeypatch):
    monkeypatch.setenv("TRAINOPS_PROMETHEUS_URL", prometheus_url(sandbox_cluster.spec))
    job_id, run_dir = _submit_long_run(steps=400, extra=[f"metrics.prometheus_port_base={EXPORTER_PORT_BASE}"])
    try:
        deadline = time.monotonic() + 60
        while True:  # scraped every second once both exporters are up
            out = call("query_metrics", {"run": run_dir.name, "metric": "step_time_s", "monitor": "prometheus",
                                         "per_node": "max"}, OPERATOR)
            if set(out.nodes) == {"n1", "n2"} or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert set(out.nodes) == {"n1", "n2"}, out
        assert {(s.rank, s.node) for s in out.instant} == {(0, "n1"), (1, "n2")}
    finally:
        call("cancel_job", {"scheduler": "slurm", "job_id": job_id, "force": True}, OPERATOR)
