"""Steering the SOP between steps (issue 40 item 4): `sop_steer` records one typed change to a
session's plan ("also try activation checkpointing" is add_arm, "skip the node-loss drill"
skip_drill, "stop after the baseline" stop_after S2), and the offline plan (skills.sop.next_step)
follows it. A steer that breaks a rule is refused at the gate with the rule's id before it is
recorded or anyone is asked to approve it: two knobs in one arm (R-ABL-1), skipping S1 (R-ENV-1),
skipping the baseline or the design that every arm is measured against (R-ABL-1), skipping the pack
a human decides on (R-APR-1). Called by the agent, a steer waits for a human like any change to
the world; the pack lists each steer with who asked and why (skills.sop_trail)."""
from __future__ import annotations

import time
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field

from trainops.skills import ablation
from trainops.skills.drill import drill
from trainops.skills.sop_session import SopSession, Steer, SteerChange, save
from trainops.skills.sop_steps import STEP_INPUT, SessionId, declared_first, one_line, session_of
from trainops.tools.base import InputCheck, ToolError, tool
from trainops.tools.context import active_call, effective_context

STEPS = ("S1", "S2", "S3", "S4", "S5", "S6")


class SopSteerInput(BaseModel):
    model_config = STEP_INPUT

    session: str = SessionId
    change: SteerChange = Field(description="add_arm / skip_arm (NAME=VALUE), add_drill / skip_drill (a fault), "
                                            "skip_step (S4: no arm, S5: no drill), stop_after (S1..S5: the pack next)")
    value: str = Field(min_length=1, max_length=200, description="the arm NAME=VALUE, the fault, or the step")
    reason: Annotated[str, AfterValidator(one_line)] = Field(min_length=3, max_length=500,
                                                              description="why, in one line; shown in the pack beside "
                                                                          "the choice")


class SopSteerOutput(BaseModel):
    session_id: str
    arms: list[str] = Field(description="the arms S4 runs now, in order")
    drills: list[str] = Field(description="the faults S5 drills now")
    stops_after: str | None = Field(description="the step the pack follows, when a steer stops early")


def _one_knob(inp: SopSteerInput) -> str | None:
    """R-ABL-1: an added arm changes exactly one setting."""
    if inp.change != "add_arm":
        return None
    specs = [part for part in inp.value.split(",") if part.strip()]
    return None if len(specs) == 1 else (f"add_arm: an arm changes exactly one variable, got {len(specs)} "
                                         f"({', '.join(specs)}); steer once per knob")


def _keeps_the_declaration(inp: SopSteerInput) -> str | None:
    """R-ENV-1: S1 is the environment every figure is read against; it cannot be skipped."""
    if inp.change == "skip_step" and inp.value == "S1":
        return "skip_step S1: S1 declares the environment every figure is read against and cannot be skipped"
    return None


def _keeps_the_baseline(inp: SopSteerInput) -> str | None:
    """R-ABL-1: every arm is measured against the baseline (S2) in S3's order."""
    if inp.change == "skip_step" and inp.value in ("S2", "S3"):
        return (f"skip_step {inp.value}: every arm is measured against S2's baseline in the order S3 ranks; to run "
                "no arm, skip S4, or stop_after S2")
    return None


def _keeps_the_pack(inp: SopSteerInput) -> str | None:
    """R-APR-1: the pack is what a human approves or rejects."""
    if inp.value == "S6" and inp.change in ("skip_step", "stop_after"):
        return f"{inp.change} S6: the pack is what a human approves or rejects; it is always written"
    return None


def _check(session: SopSession, inp: SopSteerInput) -> None:
    """What the gate's checks cannot see without the session: a known step, arm or fault, and a plan not
    already done."""
    if session.pack is not None:
        raise ToolError("sop_steer", f"session {session.session_id} is finished (its pack is {session.pack}): "
                                     "declare a new SOP with sop_declare")
    if inp.change in ("skip_step", "stop_after") and inp.value not in STEPS:
        raise ToolError("sop_steer", f"value: {inp.value!r} is not a step; use one of {', '.join(STEPS)}")
    if inp.change == "add_arm":
        try:
            ablation.check_arms(session.request(), [inp.value])
        except ValueError as exc:
            raise ToolError("sop_steer", f"value: {exc}") from None
    if inp.change in ("add_drill", "skip_drill") and inp.value not in drill.DRILLS:
        raise ToolError("sop_steer", f"value: unknown fault {inp.value!r}; use one of {', '.join(drill.DRILLS)}")
    if inp.change == "skip_arm" and inp.value not in session.arms_to_run():
        raise ToolError("sop_steer", f"value: {inp.value!r} is not an arm S4 would run "
                                     f"({', '.join(session.arms_to_run()) or 'none'})")


@tool("sop_steer", risk="mutate", tags=("sop",),
      checks=(InputCheck("R-ENV-1", declared_first), InputCheck("R-ABL-1", _one_knob),
              InputCheck("R-ENV-1", _keeps_the_declaration), InputCheck("R-ABL-1", _keeps_the_baseline),
              InputCheck("R-APR-1", _keeps_the_pack)))
def sop_steer(inp: SopSteerInput) -> SopSteerOutput:
    """Change the SOP's plan between steps: add or skip an arm or a drill, skip S4 or S5, or stop after
    a step (the pack comes next). One knob per arm; S1, S2, S3 and the pack cannot be skipped. Recorded
    in the session with who asked and why; the pack lists it. Returns the plan as it now stands."""
    session = session_of("sop_steer", inp.session)
    _check(session, inp)
    running = active_call()
    steer = Steer(change=inp.change, value=inp.value, reason=inp.reason, by=effective_context(None).label,
                  at=time.time(), approved_call=running.approved_call if running else None)
    session = save(session.model_copy(update={"steers": [*session.steers, steer]}))
    return SopSteerOutput(session_id=session.session_id, arms=session.arms_to_run(), drills=session.drills_to_run(),
                          stops_after=session.stops_after())
