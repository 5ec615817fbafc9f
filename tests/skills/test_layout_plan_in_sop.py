"""The parallel-strategy plan is an SOP output: the mapping and its cross-domain verdict come from
the declared topology (scale-up domain, nodes), never the planning host's devices, with the
expert-parallel bandwidth estimate for a MoE shape (issue 24, item 7)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainops.skills import planning
from trainops.skills.evidence.pack import assemble
from trainops.skills.evidence.render import to_markdown
from trainops.skills.request import JobRequest
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.langchain import as_langchain_tools
from trainops.trainer import layout
from trainops.trainer.config import load_config
from trainops.workspace import runs_dir

TP2 = ["parallel.tp=2", "training.global_batch=8", "training.micro_batch=1"]


def _gpu_env(factories, domain: int | None = 8, gbit: float | None = None):
    return factories.environment().model_copy(update={
        "hardware": "NVIDIA H100 80GB HBM3 (Hopper (NVIDIA H100 80GB HBM3, sm_90))", "backend": "nccl",
        "accelerator_kind": "gpu", "scale_up_domain": domain, "inter_node_gbit_s": gbit})


def test_tp_across_nodes_fails_on_the_declared_topology_whatever_this_host_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the planning host "has" 8 GPUs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    out = call("plan_layout", {"preset": "tiny", "nproc": 2, "nodes": 2, "scale_up_domain": 8, "overrides": TP2})
    assert out.valid is False and out.topology.tp_inside_domain is False
    assert out.topology.verdict.startswith("fail: tp=2 crosses scale-up domains of 1 rank(s)")
    assert {m.dim: m.placement for m in out.topology.mapping}["tp"] == "across nodes"


def test_tp_inside_the_declared_domain_passes_on_a_host_without_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = call("plan_layout", {"preset": "tiny", "nproc": 8, "nodes": 2, "scale_up_domain": 4, "overrides": TP2})
    assert out.valid and out.topology.verdict.startswith("pass: tp=2 stays inside one scale-up domain of 4")
    placements = {m.dim: m.placement for m in out.topology.mapping}
    assert placements == {"pp": "not split", "dp_replicate": "not split", "dp_shard": "across nodes",
                          "cp": "not split", "tp": "inside one scale-up domain"}


def test_the_trainer_no_longer_asks_the_host_for_its_device_count():
    assert not hasattr(layout, "detect_gpus_per_node")
    assert "device_count" not in Path(layout.__file__).read_text()


def test_the_moe_shape_gives_all_to_all_bytes_per_step_against_the_declared_bandwidth():
    out = call("plan_layout", {"preset": "tiny", "nproc": 8, "nodes": 2, "scale_up_domain": 4, "overrides": TP2,
                               "moe": {"experts": 8, "top_k": 2, "ep": 4}, "inter_node_gbit_s": 100})
    ep = out.topology.expert_parallel
    layout = out.plan["layout"]

    args = load_config(None, "tiny", TP2).model_args()
    tokens = layout["micro_batch"] * layout["seq_len"]
    expected = 4 * args.n_layers * layout["grad_accumulation"] * tokens * 2 * args.dim * 2 * 3 / 4
    assert ep.placement == "across nodes" and ep.all_to_all_bytes_per_step == pytest.approx(expected)
    assert ep.all_to_all_s_per_step == pytest.approx(expected * 8 / 100e9)
    assert ep.bandwidth_basis == "declared inter-node bandwidth"


def test_an_undeclared_bandwidth_leaves_the_time_unestimated_and_says_which_field():
    out = call("plan_layout", {"preset": "tiny", "nproc": 8, "nodes": 2, "scale_up_domain": 4, "overrides": TP2,
                               "moe": {"experts": 8, "top_k": 2, "ep": 4}})
    assert out.topology.expert_parallel.all_to_all_s_per_step is None
    assert "pass inter_node_gbit_s" in out.topology.expert_parallel.bandwidth_basis


def test_a_moe_shape_that_does_not_fit_is_refused_naming_the_field():
    with pytest.raises(ToolError, match="moe.experts=8 is not divisible by moe.ep=3"):
        call("plan_layout", {"preset": "tiny", "nproc": 2, "moe": {"experts": 8, "top_k": 2, "ep": 3}})
    out = call("plan_layout", {"preset": "tiny", "nproc": 2, "moe": {"experts": 8, "top_k": 1, "ep": 4}})
    assert out.valid is False and "moe.ep=4 does not divide the data-parallel degree dp=2" in out.error


def test_nodes_that_do_not_divide_the_world_are_refused():
    with pytest.raises(ToolError, match="nodes=3 does not divide nproc=4"):
        call("plan_layout", {"preset": "tiny", "nproc": 4, "nodes": 3})


def test_the_sop_step_plans_on_the_declared_domain_and_the_report_shows_it(factories):
    req = JobRequest(preset="tiny", nproc=1, nodes=2, overrides=TP2)
    plan = planning.layout_plan(req, _gpu_env(factories), {"experts": 8, "top_k": 2, "ep": 1})
    assert plan.world_size == 2 and plan.valid is False and "crosses scale-up domains" in plan.topology.verdict
    assert "scale-up domain 8" in plan.topology_source and "2 node(s) x 1 process(es)" in plan.topology_source
    run = factories.write_run(runs_dir() / "base-1")
    pack = assemble("pack-l", factories.environment(), factories.baseline([str(run)]), [], [], [], layout_plan=plan)
    markdown = to_markdown(pack)
    assert "## Parallel-strategy plan (declared topology)" in markdown
    assert "**Cross-domain verdict.** fail: tp=2 crosses scale-up domains" in markdown
    assert "**Expert parallel (on paper).** 8 experts, top-2, ep=1" in markdown


@pytest.mark.slow
def test_the_quick_sop_pack_carries_the_layout_plan_and_the_checkpoint_occupancy(quick_sop):
    pack = Path(quick_sop["pack_dir"])
    evidence = json.loads((pack / "evidence.json").read_text())
    plan = evidence["layout_plan"]
    assert plan["world_size"] == 2 and plan["valid"] is True
    assert plan["topology"]["verdict"].startswith("pass: tp=1 stays inside one scale-up domain of 2")
    assert "no scale-up domain declared" in plan["topology"]["domain_basis"]  # a CPU run: the node is the domain
    assert evidence["checkpoint_plan"]["write_occupancy_pct"] > 0
    report = (pack / "report.md").read_text()
    assert "## Parallel-strategy plan (declared topology)" in report and "Write-bandwidth occupancy.** " in report


def test_the_agent_tool_input_takes_the_moe_shape():
    (tool,) = as_langchain_tools(["plan_layout"])
    schema = tool.args_schema.model_json_schema()
    moe = schema["$defs"]["MoeShape"]["properties"]
    assert {"moe", "nodes", "scale_up_domain", "inter_node_gbit_s"} <= set(schema["properties"])
    assert {"experts", "top_k", "ep", "moe_layers"} <= set(moe)
