"""Framework tools for the agent and the CLI: a framework's knobs and version, and a pre-launch
check of knob values and overrides against the framework's own flag rules."""
from __future__ import annotations

from pydantic import BaseModel, Field

from trainops.tools.base import tool
from trainops.tools.frameworks import get_adapter
from trainops.tools.frameworks.base import FrameworkKnob, FrameworkName, FrameworkRefused


class FrameworkRef(BaseModel):
    framework: FrameworkName = Field(description="trainops (the embedded trainer), deepspeed, torchtitan or megatron.")


class FrameworkKnobs(BaseModel):
    framework: FrameworkName
    display_name: str
    version: str = Field(description="Installed version, or 'not installed'.")
    knobs: list[FrameworkKnob]


@tool("framework_knobs", risk="read", tags=("frameworks",))
def framework_knobs(inp: FrameworkRef) -> FrameworkKnobs:
    """A training framework's ablation knobs, each mapped to the framework's own flag or config key
    with its category and expected effect, and the framework's installed version."""
    adapter = get_adapter(inp.framework)
    return FrameworkKnobs(framework=inp.framework, display_name=adapter.display_name, version=adapter.version(),
                          knobs=adapter.knobs())


class CheckFrameworkJobInput(FrameworkRef):
    knobs: dict[str, str] = Field(default_factory=dict,
                                  description="Knob values to check, e.g. {'tp_comm_overlap': 'true'}.")
    overrides: list[str] = Field(default_factory=list,
                                 description="The job's section.key=value overrides (the adapter's keys).")
    world_size: int = Field(2, ge=1, description="Processes the job will run on.")


class CheckFrameworkJobOutput(BaseModel):
    accepted: bool
    refusal: str = Field("", description="Why the framework would refuse it, naming the flag and the fix; empty when "
                                         "accepted.")
    layout: str = Field("", description="The parallel layout an MFU claim about this job must name.")


@tool("check_framework_job", risk="read", tags=("frameworks",))
def check_framework_job(inp: CheckFrameworkJobInput) -> CheckFrameworkJobOutput:
    """Check knob values and overrides against the framework's own prerequisites between flags
    (e.g. Megatron --tp-comm-overlap needs --sequence-parallel; DeepSpeed param offload needs ZeRO-3;
    torchtitan's parallel degrees must multiply to the world size) before anything is launched."""
    adapter = get_adapter(inp.framework)
    try:
        adapter.validate(inp.knobs, overrides=inp.overrides, world_size=inp.world_size)
    except FrameworkRefused as exc:
        return CheckFrameworkJobOutput(accepted=False, refusal=str(exc))
    overrides = [*inp.overrides, *(f"{k.override}={inp.knobs[k.name]}" for k in adapter.knobs() if k.name in inp.knobs)]
    return CheckFrameworkJobOutput(accepted=True, layout=adapter.describe_layout(overrides, inp.world_size))
