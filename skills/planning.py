"""Planning steps (checkpoint interval, effective training time, layout) through the tools."""
from __future__ import annotations

from pydantic import BaseModel

from tools.base import CallContext, call


def plan_checkpoint(save_s: float, restart_s: float, mtbf_h: float, ctx: CallContext | None = None) -> BaseModel:
    """Young/Daly interval from the measured write cost and the failure rate."""
    return call("plan_checkpoint_interval", {"save_s": save_s, "restart_s": restart_s, "mtbf_h": mtbf_h}, ctx)


def plan_ettr(params: dict, ctx: CallContext | None = None) -> BaseModel:
    """Effective training time for a checkpoint policy and failure profile."""
    return call("plan_effective_training_time", params, ctx)


def plan_layout(params: dict, ctx: CallContext | None = None) -> BaseModel:
    """Dry-run the parallel layout: degrees divide the world, TP stays inside the scale-up domain."""
    return call("plan_layout", params, ctx)
