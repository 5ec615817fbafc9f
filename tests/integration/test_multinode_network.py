"""Network faults on a multi-node job, for real, on a `trainops sandbox` Slurm cluster: a partitioned
node (link down, slurmd alive) and a node behind a slow link are each detected from the job's own
signals and named by a probe of the nodes, drained through the gated tool, replaced by the hot spare,
then repaired, health-checked and returned to the pool; Slurm's view is recorded as confirmation."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trainops.skills.drill.drill import drill
from trainops.skills.request import JobRequest
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.sandbox.cluster import node_states

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.usefixtures("as_operator")]
OPERATOR = CallContext(actor="operator")
HEARTBEAT_STALE_S = 5.0  # detect_faults' default, which the drill uses


def _drill(fault: str):
    req = JobRequest(preset="tiny", nproc=1, nodes=2, scheduler="slurm", timeout_s=240,
                     overrides=["training.steps=60", "data.kind=synthetic", "checkpoint.enable=true",
                                "checkpoint.interval=3"])
    result, row = drill(req, fault, inject_step=4, ctx=OPERATOR)
    return result, row, json.loads(Path(result.drill_record).read_text())


def _events(record: dict, node: str) -> list[str]:
    return [e["event"] for e in record["node_timeline"] if e["node"] == node]


def _order(events: list[str], *prefixes: str) -> list[int]:
    return [next(i for i, e in enumerate(events) if e.startswith(p)) for p in prefixes]


def _back_in_pool(cluster, node: str) -> None:
    deadline = time.monotonic() + 30
    while node_states(cluster)[node] != "idle":
        assert time.monotonic() < deadline, node_states(cluster)
        time.sleep(0.5)


def test_a_partitioned_node_is_caught_by_its_stale_heartbeat_drained_and_replaced_by_the_spare(sandbox_cluster):
    result, row, record = _drill("partition")
    assert result.detector.startswith("heartbeat_stale"), result.detector
    assert result.detection_latency_s <= HEARTBEAT_STALE_S + 1.0
    assert result.isolation_granularity == "node" and result.cause == "network"
    assert record["replaced"] == "n2 replaced by n3"
    assert "Slurm confirmed n2 not responding" in result.detector
    assert result.async_checkpoint_intact and result.recovery_time_s > 0
    events = _events(record, "n2")
    steps = _order(events, "injected partition", "detected: heartbeat_stale", "drained", "healed", "health check",
                   "resumed")
    assert steps == sorted(steps), events
    assert "does not answer on the network" in events[steps[1]]
    assert "n2 replaced by n3" in row.value
    _back_in_pool(sandbox_cluster, "n2")

    plan = call("plan_checkpoint_interval", {"save_s": 1.0, "mtbf_h": 2.0, "restart_from": "newest_node_drill"},
                OPERATOR)
    assert plan.restart_s == pytest.approx(result.detection_latency_s + result.recovery_time_s)
    assert plan.restart_source.startswith("measured: partition drill")


def test_a_node_behind_a_slow_link_is_named_from_probes_drained_and_replaced_by_the_spare(sandbox_cluster):
    result, _row, record = _drill("slow-network")
    assert result.detector.startswith("slow_link"), result.detector
    assert record["replaced"] == "n2 replaced by n3"
    assert "Slurm never flagged n2" in result.detector  # the slow node still answers Slurm's pings
    events = _events(record, "n2")
    steps = _order(events, "injected slow_network", "detected: slow_link", "drained", "healed", "health check",
                   "resumed")
    assert steps == sorted(steps), events
    assert "node n2 answers a connect in" in events[steps[1]]
    _back_in_pool(sandbox_cluster, "n2")
