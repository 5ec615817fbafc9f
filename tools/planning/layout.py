"""Whether a parallel layout fits: the trainer's dry run for a config and a world size, then where
each dimension's groups land on the declared topology (tools/planning/layout_mapping.py)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator

from trainops.tools.base import ToolError, tool
from trainops.tools.planning.layout_alternatives import (
    LayoutOption,
    PipelineCost,
    alternatives,
    pipeline_cost,
    seconds_at,
    size,
    tp_bytes,
)
from trainops.tools.planning.layout_mapping import MoeShape, TopologyPlan, expert_parallel, map_layout
from trainops.trainer.config import JobConfig, LoadedConfig, load_config
from trainops.trainer.layout import plan_dry_run
from trainops.workspace import confine

MAX_NPROC = 65536  # a read tool the agent calls freely: the rank grid it builds stays under a second


class LayoutInput(BaseModel):
    config: str | None = Field(None, description="Path to a job config TOML; omit to use a preset.")
    preset: str | None = Field(None, description="Model preset when no config is given (tiny, small, llama3-8b, ...).")
    overrides: list[str] = Field(default_factory=list, description="section.key=value overrides, e.g. parallel.tp=2.")
    nproc: int = Field(gt=0, le=MAX_NPROC, description=f"Number of processes (world size) to plan for, at most "
                                                      f"{MAX_NPROC}.")
    nodes: int = Field(1, ge=1, le=MAX_NPROC, description="Nodes the world spreads over, nproc/nodes ranks each (the "
                                                          "declared topology, not this host).")
    scale_up_domain: int | None = Field(None, ge=1, le=MAX_NPROC,
                                        description="Accelerators sharing one scale-up domain (NVLink/NVSwitch), as "
                                                    "the environment declaration states it; omit on CPU hosts (the "
                                                    "node is the domain).")
    moe: MoeShape | None = Field(None, description="Mixture-of-experts shape (experts, top_k, ep, moe_layers) for the "
                                                   "expert-parallel bandwidth estimate.")
    inter_node_gbit_s: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False,
                                            description="Declared or measured inter-node bandwidth, Gbit/s (for an "
                                                        "expert-parallel group across nodes).")
    intra_node_gbit_s: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False,
                                            description="Declared scale-up bandwidth inside a node, Gbit/s.")
    job_config: LoadedConfig = Field(None, exclude=True,
                                     description="The config of config/preset/overrides as a skill's command "
                                                 "loaded it; None: loaded here.")

    @model_validator(mode="after")
    def _nodes_divide(self) -> LayoutInput:
        if self.nproc % self.nodes:
            raise ValueError(f"nodes={self.nodes} does not divide nproc={self.nproc}: every node runs nproc/nodes "
                             "ranks; pass the world size (nodes x processes per node)")
        return self


class LayoutOutput(BaseModel):
    valid: bool = Field(description="Whether the layout fits the world size and the model.")
    error: str | None = Field(None, description="Why the layout is invalid, with the numbers.")
    plan: dict[str, Any] = Field(default_factory=dict,
                                 description="The trainer's dry-run plan (mesh, degrees, memory, ...).")
    topology: TopologyPlan | None = Field(None, description="Where each dimension's groups land on the declared "
                                                            "topology, the cross-domain verdict, and the "
                                                            "expert-parallel estimate.")
    alternatives: list[LayoutOption] = Field(default_factory=list,
                                             description="When tp crosses a scale-up domain: the layouts that keep it "
                                                         "inside, each with its cost (K-FM-1).")
    pipeline: PipelineCost | None = Field(None, description="With pp > 1: its bubble at this many micro-batches, and "
                                                            "whether it pays at this scale (K-STEP-5).")


def _config_path(inp: LayoutInput) -> Path | None:
    """The config path a call names, confined: a path the model chose is confined like every other
    path a tool reads, so no file outside the workspace (its existence, its TOML) reaches the model.
    Checked even when the caller hands the config in already loaded, so the refusal is the same."""
    try:
        return confine(inp.config, "config", reading=True, must_exist=True) if inp.config else None
    except ValueError as exc:
        raise ToolError("plan_layout", str(exc)) from None


def _load(inp: LayoutInput) -> JobConfig:
    """The config a call names (config, preset, overrides), its path confined first."""
    config = _config_path(inp)
    if inp.job_config is not None:
        return inp.job_config
    try:
        return load_config(config, inp.preset, inp.overrides)
    except (OSError, ValueError) as exc:
        raise ToolError("plan_layout", f"cannot load config {inp.config or inp.preset!r}: {exc}") from None


def _plain(obj: Any) -> dict[str, Any]:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj):
        return dataclasses.asdict(obj)
    if isinstance(obj, dict):
        return obj
    return {"plan": str(obj)}


@tool("plan_layout", risk="read", tags=("planning", "parallel"))
def plan_layout(inp: LayoutInput) -> LayoutOutput:
    """Validate a parallel layout (dp_replicate x dp_shard x cp x tp x pp) for a job config and a
    world size without starting any process: the trainer's dry run, then where each dimension's
    groups land on the declared topology (nodes, scale-up domain) with the verdict on tensor
    parallel crossing a domain, and, for a MoE shape, the expert all-to-all bytes per step against
    the declared bandwidth. An impossible layout comes back as valid=false with the reason."""
    cfg = _load(inp)
    try:
        plan = plan_dry_run(cfg, inp.nproc)
    except ValueError as exc:
        return LayoutOutput(valid=False, error=str(exc))
    layout = plan.layout
    topology = map_layout(dict(zip(plan.mesh_dim_names, plan.mesh_shape, strict=True)), inp.nproc, inp.nodes,
                          inp.scale_up_domain)
    if inp.moe is not None:
        args = cfg.model_args()
        try:
            topology.expert_parallel = expert_parallel(inp.moe, layout, args.dim, args.n_layers, topology.domain_ranks,
                                                       topology.ranks_per_node, inp.inter_node_gbit_s,
                                                       inp.intra_node_gbit_s)
        except ValueError as exc:
            return LayoutOutput(valid=False, error=str(exc), plan=_plain(plan), topology=topology)
    options = [] if topology.tp_inside_domain else alternatives(cfg, inp.nproc, topology.domain_ranks,
                                                                 inp.intra_node_gbit_s, inp.inter_node_gbit_s)
    if options:
        topology.verdict += "; " + _instead(cfg, plan, inp, options)
    return LayoutOutput(valid=topology.tp_inside_domain, error=None if topology.tp_inside_domain else topology.verdict,
                        plan=_plain(plan), topology=topology, alternatives=options,
                        pipeline=pipeline_cost(layout.pp, plan.n_microbatches, inp.nodes))


def _instead(cfg: JobConfig, plan, inp: LayoutInput, options: list[LayoutOption]) -> str:
    """The cross-domain verdict's numbers: what tp costs now, and the layouts that fit instead."""
    now = tp_bytes(cfg, cfg.parallel.tp, max(len(r.layers) for r in plan.ranks), plan.n_microbatches)
    took = seconds_at(now, inp.inter_node_gbit_s)
    link = f", {took} s at {inp.inter_node_gbit_s} Gbit/s" if took is not None else ""
    fitting = [o.summary for o in options if o.fits][:3]
    return (f"now tp moves {size(now)} per rank per step across domains{link}; "
            + ("instead: " + "; ".join(fitting) if fitting else
               "no smaller tp fits this model and batch: " + "; ".join(f"{o.summary} ({o.why_not})"
                                                                       for o in options[:2])))
