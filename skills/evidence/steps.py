"""The SOP's step calls and choices as the pack carries them (issue 40 item 3): each step S1..S6 with
the audit entry of the call that ran it, and each choice (the arms, the order they ran in, the
drills, a rollout stop) with who made it and the reason given. A contract module: it imports
nothing above it; trainops.skills.sop_trail builds it from the SOP session checked against the
audit log, never from what a caller passes in."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

ChosenBy = Literal["planner", "model", "human", "unrecorded"]
"""planner: trainops' offline plan (S3's ranking, the framework's default arms and drills, the
ladder's stop rule); model: the agent, calling a step itself; human: an operator's steer (a step
called by hand, or an arm or drill named when the SOP was declared); unrecorded: no audited call
acted on it, so who chose it is not on record."""


class PackStep(BaseModel):
    """One SOP step call as the session recorded it and as the audit log holds it."""

    step: Literal["S1", "S2", "S3", "S4", "S5", "S6"]
    tool: str = Field(description="the step tool the session says ran it")
    at: float = Field(description="unix time the step's result was recorded")
    result: str = Field(description="the step's finding in one line, as the session recorded it")
    runs: list[str] = Field(default_factory=list, description="run ids the step launched")
    called_by: str = Field(description="the caller as the audit entry of the call names it (its actor); empty: "
                                       "no audit entry was found")
    audit_seq: int | None = Field(description="seq of the call's intent entry in the audit log; None: none found")
    audit_hash: str = Field(description="hash of that intent entry (the id its outcome entry refers to)")
    outcome_seq: int | None = Field(description="seq of the call's outcome entry; None for S6, whose outcome is "
                                                "written after this pack, or when the call has none")
    audited: bool = Field(description="the audit log holds this call as the session records it")
    note: str = Field("", description="what the check against the audit log found wrong, or, for S6, what it "
                                      "cannot see yet")


class PackChoice(BaseModel):
    """One choice the SOP made: an arm (and its place in the order), a drill, or a rollout stop."""

    kind: Literal["arm", "drill", "stop", "steer"] = Field(description="an arm, a drill, a rollout stop, or a "
                                                                       "steer that skipped or stopped part of the plan")
    subject: str = Field(description="the arm NAME=VALUE, the fault drilled, or the arm and rung where it stopped")
    order: int | None = Field(description="the position it ran in, 1 first; None: ranked but not run")
    chosen_by: ChosenBy = Field(description="who chose it: the offline planner, the model, a human's steer, or "
                                                "unrecorded (no audited call)")
    caller: str = Field(description="the audit log's actor of the call that acted on it; empty: no audit entry")
    reason: str = Field(description="the reason given: S3's ranking line, the declaration, the rung row's stop")
    audit_seq: int | None = Field(description="seq of that call's intent entry; None: none found")
