"""The environment declaration of a multi-node Slurm cluster (a `trainops sandbox` of namespace
nodes): its training nodes, CPUs per node and hot spares
(the shadow partition's node listed apart), and an inter-node all-reduce measured by a real
2-node gloo job submitted through the scheduler."""
from __future__ import annotations

import pytest

from trainops.tools.base import ToolError
from trainops.tools.calls import call


@pytest.mark.services
@pytest.mark.slow
def test_a_multi_node_declaration_measures_all_reduce_between_two_nodes(sandbox_cluster, workspace):
    out = call("declare_environment", {"scheduler": "slurm", "ckpt_test_mib": 2, "measure_gemm": False,
                                       "measure_interconnect": True})
    assert out.scheduler.nodes == ["n1", "n2", "n3"]
    assert out.scheduler.cpus_per_node == {"n1": 2, "n2": 2, "n3": 2}
    assert out.scheduler.hot_spare_nodes == ["n1", "n2", "n3"]
    assert out.scheduler.shadow_nodes == ["n4", "n5"], "the shadow partition's nodes are listed apart, never spares"
    measured = out.inter_node_all_reduce
    assert measured is not None and len(set(measured.nodes)) == 2, measured
    assert measured.latency_us > 0 and measured.bandwidth_gbit_s > 0 and measured.message_mib == 16
    assert out.interconnect.startswith(f"between nodes {', '.join(measured.nodes)}: all-reduce")
    assert not list(workspace.glob("interconnect-*")), "the measurement job's folder is removed"


def test_measuring_the_interconnect_needs_a_multi_node_scheduler():
    with pytest.raises(ToolError, match="measure_interconnect=true needs scheduler='slurm'"):
        call("declare_environment", {"scheduler": "local", "measure_interconnect": True})


def test_a_declaration_without_the_measurement_reports_none():
    out = call("declare_environment", {"ckpt_test_mib": 1, "measure_gemm": False})
    assert out.inter_node_all_reduce is None
