"""`list_pending_approvals`: what waits for a human, as a read-only typed tool the agent can
call: gated calls and evidence packs from governance, and agent threads paused at an
approval. It lives with the agent because it reads the agent's own thread store."""
from __future__ import annotations

from pydantic import BaseModel, Field

from tools.base import tool


class PendingInput(BaseModel):
    include_decided: bool = Field(False, description="Also list items already approved or rejected.")


class PendingItem(BaseModel):
    kind: str = Field(description="call (a gated tool call), pack (an evidence pack) or thread (an agent thread paused for a decision)")
    id: str
    status: str
    detail: str


class PendingOutput(BaseModel):
    items: list[PendingItem]
    count_pending: int


@tool("list_pending_approvals", risk="read", tags=("governance", "agent"))
def list_pending_approvals(inp: PendingInput) -> PendingOutput:
    """List what waits for a human decision: gated tool calls, evidence packs and agent threads paused at an approval."""
    from agents.session import list_threads
    from tools.governance.approvals import list_items

    items = [PendingItem(kind=i.kind, id=i.id, status=i.status, detail=i.detail) for i in list_items()
             if inp.include_decided or i.status == "pending"]
    items += [PendingItem(kind="thread", id=t.thread_id, status="pending",
                          detail=f"{', '.join(t.waiting_tools) or 'a call'} waits for a decision; "
                                 f"resume with `trainops chat --thread {t.thread_id}`")
              for t in list_threads() if t.pending_approvals]
    return PendingOutput(items=items, count_pending=sum(1 for i in items if i.status == "pending"))
