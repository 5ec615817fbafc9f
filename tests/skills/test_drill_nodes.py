"""The parts of a node drill that need no cluster: naming a slow node from probe round trips,
telling a reachable node from a silent one, the per-node timeline, and the replacement in words."""
from __future__ import annotations

import socket

import pytest

from trainops.skills.drill.drill import DrillRefused, drill
from trainops.skills.drill.nodes import NodeTimeline, replacement
from trainops.skills.request import JobRequest
from trainops.tools.reliability.reachability import connect_rtt_s, slow_outlier


def test_a_node_answering_far_later_than_its_peers_is_named_slow():
    node, why = slow_outlier({"n1": 0.0003, "n2": 0.130, "n3": 0.0004})
    assert node == "n2"
    assert "130 ms" in why and "n1, n3" in why


@pytest.mark.parametrize("rtts", [
    {"n1": 0.0003, "n2": 0.0009},          # all fast: a jitter of a millisecond is no slow link
    {"n1": 0.030, "n2": 0.040},            # all slow alike: the fabric, not one node
    {"n1": 0.0003, "n2": None},            # a silent node is a partition, left to the heartbeat
    {"n1": 0.2},                           # one node has no peer to compare with
])
def test_no_node_is_named_slow_without_one_clear_outlier(rtts):
    assert slow_outlier(rtts) is None


def test_a_refused_connect_counts_as_an_answer_and_a_listening_port_too():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert connect_rtt_s("127.0.0.1", port) is not None
    assert connect_rtt_s("127.0.0.1", port) is not None  # closed now: refused, so the host is there


def test_the_timeline_keeps_each_nodes_state_at_the_fault_and_everything_after(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "none.conf"))  # no Slurm: only the drill's own events
    timeline = NodeTimeline()
    timeline.add("n1", "slurm: mixed", at=90.0)
    timeline.add("n2", "slurm: idle", at=80.0)
    timeline.add("n2", "slurm: mixed", at=95.0)
    timeline.add("n2", "injected partition", at=100.0)
    timeline.add("n2", "slurm: mixed+not_responding", at=110.0)
    rows = timeline.rows(100.0)
    assert [(r["t_s"], r["node"], r["event"]) for r in rows] == [
        (-10.0, "n1", "slurm: mixed"), (-5.0, "n2", "slurm: mixed"), (0.0, "n2", "injected partition"),
        (10.0, "n2", "slurm: mixed+not_responding")]
    assert timeline.slurm_flagged("n2", since=100.0) == 110.0
    assert timeline.injected_node() == "n2"
    assert timeline.slurm_flagged("n1", since=100.0) is None


def test_the_replacement_names_the_spare_or_says_there_was_none():
    assert replacement("n2", ["n1", "n2"], ["n1", "n3"]) == "n2 replaced by n3"
    assert replacement("n2", ["n1", "n2"], ["n1", "n2"]).startswith("n2 was not replaced")


@pytest.mark.parametrize("fault", ["partition", "slow-network"])
def test_a_network_drill_refuses_a_job_that_has_one_node(fault):
    req = JobRequest(preset="tiny", nproc=2, overrides=["checkpoint.enable=true"])
    with pytest.raises(DrillRefused, match="--scheduler slurm --nodes 2"):
        drill(req, fault)
