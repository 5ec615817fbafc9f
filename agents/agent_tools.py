"""The agent's own tools, which sit above the tools layer: `run_sop` runs the SOP skill (skills
may call tools, tools may not call skills) and `list_pending_approvals` reads the agent's own
thread store next to governance's queue. `AGENT_TOOLS` lists them; `agent_registry()` is the one
registry the CLI and the agent both use: every trainops tool plus these."""
from __future__ import annotations

from functools import cache
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from trainops.skills.sop import SopResult, SopSettings
from trainops.tools.base import tool
from trainops.tools.registry import Registry, build_registry


class PendingInput(BaseModel):
    include_decided: bool = Field(False, description="Also list items already approved or rejected.")


class PendingItem(BaseModel):
    kind: str = Field(description="call (a gated tool call), pack (an evidence pack) or thread (an agent thread "
                                  "paused for a decision)")
    id: str
    status: str
    detail: str


class PendingOutput(BaseModel):
    items: list[PendingItem]
    count_pending: int


@tool("list_pending_approvals", risk="read", tags=("governance", "agent"))
def list_pending_approvals(inp: PendingInput) -> PendingOutput:
    """List what waits for a human decision: gated tool calls, evidence packs and agent threads paused
    at an approval."""
    from trainops.agents.threads import list_threads
    from trainops.tools.governance.approvals import list_items

    items = [PendingItem(kind=i.kind, id=i.id, status=i.status, detail=i.detail) for i in list_items()
             if inp.include_decided or i.status == "pending"]
    items += [PendingItem(kind="thread", id=t.thread_id, status="pending",
                          detail=f"{', '.join(t.waiting_tools) or 'a call'} waits for a decision; "
                                 f"resume with `trainops chat --thread {t.thread_id}`")
              for t in list_threads() if t.pending_approvals]
    return PendingOutput(items=items, count_pending=sum(1 for i in items if i.status == "pending"))


class RunSopInput(SopSettings):
    @field_validator("config")
    @classmethod
    def _config_exists(cls, value: str | None) -> str | None:
        if value is not None and not Path(value).is_file():
            raise ValueError(f"config={value!r} is not a file: pass a job config TOML path, or omit config for the "
                             "embedded tiny defaults")
        return value


@tool("run_sop", risk="mutate", tags=("sop", "agent"))
def run_sop(inp: RunSopInput) -> SopResult:
    """Run the whole SOP on a job config: S1 environment declaration, S2 baseline, S3/S4 single-variable
    ablations (small scale first), S5 fault drills, S6 evidence pack. Launches training jobs (quick: about
    2 minutes on 2 CPU cores). Returns the pack folder, verdict and blockers; a human then approves the pack."""
    from trainops.skills.sop import run

    return run(inp)  # the skill acts for whoever called this tool (the agent), under that call's approval


AGENT_TOOLS = (run_sop, list_pending_approvals)


@cache
def agent_registry() -> Registry:
    """Every trainops tool and the agent's own: what `trainops tool` and the agent graph serve."""
    return build_registry(extra=AGENT_TOOLS)
