"""The expert-parallel budget from the declared MoE shape (issue 42 item 2) through `trainops tool call
plan_layout`: without a hand-typed ep the plan derives the largest degree that divides the experts and
the data-parallel degree and keeps each group inside one scale-up domain, and says so; a given ep is
still checked, and a wrong one is refused naming the field and the fix."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from trainops.cli import app

runner = CliRunner()
TWO_NODES = {"preset": "tiny", "nproc": 8, "nodes": 2, "scale_up_domain": 4, "inter_node_gbit_s": 100,
             "intra_node_gbit_s": 3600}
ONE_PER_RANK = ["training.micro_batch=1"]
TP2 = ["parallel.tp=2", "training.micro_batch=1"]


def _call(**inp) -> tuple[int, dict]:
    result = runner.invoke(app, ["tool", "call", "plan_layout", "--input", json.dumps(inp), "--json"])
    return result.exit_code, json.loads(result.output)


def _expert_parallel(**inp) -> dict:
    code, out = _call(**inp)
    assert code == 0 and out["valid"] is True, out
    return out["topology"]["expert_parallel"]


def test_ep_is_derived_as_the_widest_group_inside_one_scale_up_domain():
    ep = _expert_parallel(**TWO_NODES, overrides=ONE_PER_RANK, moe={"experts": 8, "top_k": 2})
    assert ep["ep"] == 4 and ep["placement"] == "inside one scale-up domain"  # ep=8 would cross the nodes
    assert ep["ep_basis"].startswith("derived: the largest degree dividing experts=8 and dp=8")
    assert ep["bandwidth_basis"] == "declared intra-node (scale-up) bandwidth" and ep["all_to_all_s_per_step"] > 0


def test_tensor_parallel_shares_the_domain_with_the_expert_group():
    ep = _expert_parallel(**TWO_NODES, overrides=TP2, moe={"experts": 8, "top_k": 2})
    assert ep["ep"] == 2 and ep["placement"] == "inside one scale-up domain"  # tp=2 x ep=2 fill 4 ranks


def test_the_expert_count_bounds_the_derived_degree():
    ep = _expert_parallel(**TWO_NODES, overrides=ONE_PER_RANK, moe={"experts": 6, "top_k": 2})
    assert ep["ep"] == 2 and "experts=6" in ep["ep_basis"]


def test_no_expert_parallelism_when_tensor_parallel_fills_the_domain():
    ep = _expert_parallel(**{**TWO_NODES, "scale_up_domain": 2}, overrides=TP2, moe={"experts": 8, "top_k": 2})
    assert ep["ep"] == 1 and ep["placement"] == "not split" and ep["all_to_all_bytes_per_step"] == 0
    assert "no degree above 1" in ep["ep_basis"]


def test_a_given_ep_is_kept_and_said_to_be_given():
    ep = _expert_parallel(**TWO_NODES, overrides=ONE_PER_RANK, moe={"experts": 8, "top_k": 2, "ep": 8})
    assert ep["ep"] == 8 and ep["placement"] == "across nodes" and ep["ep_basis"] == "given: moe.ep=8"


def test_a_given_ep_that_does_not_divide_the_experts_is_refused_with_the_fix():
    code, out = _call(**TWO_NODES, overrides=ONE_PER_RANK, moe={"experts": 8, "top_k": 2, "ep": 3})
    assert code == 2 and "moe.experts=8 is not divisible by moe.ep=3" in out["error"]
    assert "omit moe.ep to derive it" in out["error"]


def test_a_given_ep_that_does_not_divide_dp_is_refused_with_the_fix():
    code, out = _call(**TWO_NODES, overrides=TP2, moe={"experts": 8, "top_k": 2, "ep": 8})
    assert out["valid"] is False and "moe.ep=8 does not divide the data-parallel degree dp=4" in out["error"]
    assert "omit moe.ep to derive it" in out["error"]


def test_a_shape_without_its_expert_count_is_refused_naming_the_field():
    code, out = _call(**TWO_NODES, moe={"top_k": 2})
    assert "moe.experts" in out["error"]
