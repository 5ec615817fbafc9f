"""The offline policy walking the SOP as its own tool calls (issue 40): the "sop" kind's plan.

First `sop_declare` (S1), which the gate queues for a human like any change the agent orders: the
approver sees the declared settings. Once it ran under that approval, each next call is the one
`skills.sop.next_step` chooses from what the session recorded (the same planner `trainops sop`
drives), each the agent's own call through the gate, which lets it run under the declaration's
approval (skills.sop_approval), until `sop_pack` (S6). The answer lists each step's finding and its
figures (a table's rows) as the session recorded them, then the pack and the command that approves
it. A failed or refused step stops the walk with its message; the session keeps what finished
(`trainops sop --resume ID`, or "go on" in the same thread: agents/sop_chat.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainops.agents.explain import Next, final, outputs, quoted, stopped
from trainops.skills import sop_session
from trainops.skills.sop import next_step
from trainops.skills.sop_pack import sop_pack
from trainops.skills.sop_steps import STEP_TOOLS
from trainops.tools.registry import spec_of

if TYPE_CHECKING:
    from langchain_core.messages import ToolMessage

    from trainops.agents.kinds import Kind
    from trainops.agents.understand import Request

STEPS = tuple(spec_of(fn).name for fn in (*STEP_TOOLS, sop_pack))
DECLARE, PACK = STEPS[0], STEPS[-1]


def declaration(request: Request) -> dict[str, Any]:
    """S1's settings from the request: its config, quick, and the scheduler it names."""
    found = request.entities
    args: dict[str, Any] = {"config": found.config} if found.config else {}
    if "quick" in request.concepts:
        args["quick"] = True
    if found.scheduler_arg:
        args["scheduler"] = next(iter(found.scheduler_arg.values()))
    return args


def session_of(session_id: object) -> sop_session.SopSession | str:
    """The session as trainops wrote it, or the answer saying why the SOP cannot go on."""
    try:
        return sop_session.load(str(session_id))
    except ValueError as exc:
        return f"The SOP stopped: {exc}."


def plan(kind: Kind, request: Request, done: dict[str, dict], results: list[ToolMessage],
         schemas: dict[str, dict]) -> Next:
    """S1, then the planner's next step on the session S1 started, until the pack; a step that
    failed or waits for a human ends the turn saying so."""
    if failed := next((r for r in results if r.status == "error"), None):
        return stopped_at(failed)
    if not results:
        return DECLARE, declaration(request)
    return walk(session_of((outputs(results).get(DECLARE) or {}).get("session_id")), results, schemas)


def walk(session: sop_session.SopSession | str, results: list[ToolMessage], schemas: dict[str, dict]) -> Next:
    """The planner's next step on the session (skills.sop.next_step, as steered), or, once its pack
    is written, the answer."""
    if isinstance(session, str):
        return session
    step = next_step(session)
    if step is None:
        return answer(session, outputs(results).get(PACK) or {})
    fn, inp = step
    name = spec_of(fn).name
    if name not in schemas:
        return f"I need the tool {name} for the next SOP step, and it is not offered here (see `trainops tool list`)."
    return name, inp.model_dump(mode="json", exclude_defaults=True)


def stopped_at(failed: ToolMessage) -> Next:
    data = failed.artifact if isinstance(failed.artifact, dict) else {}
    if data.get("kind") == "pending":
        return final("answered", f"{failed.name} is queued for a human's approval as {data['pending_id']}; nothing "
                                 f"has run. A human signs it with `trainops approve --pending {data['pending_id']}` "
                                 "or rejects it.")
    return stopped(failed.name, failed.artifact) + "; the SOP session keeps the steps that finished."


def landed(tool: str, output: Any) -> sop_session.StepLog | None:
    """A step's result as its session recorded it (its finding in one line and its figures as rows):
    what chat shows as the step lands; None for any other tool or output."""
    if tool not in STEPS or not isinstance(output, dict) or not output.get("session_id"):
        return None
    session = session_of(output["session_id"])
    if isinstance(session, str):
        return None
    return next((step for step in reversed(session.steps) if step.tool == tool), None)


def answer(session: sop_session.SopSession, pack: dict[str, Any]) -> str:
    """The verdict, each step's finding in the order it ran with its figures as rows, the pack and how
    a human decides it."""
    blockers = pack.get("blockers") or []
    width = max(len(step.tool) for step in session.steps)
    return "\n".join([
        f"Verdict: {quoted(pack.get('verdict'))}" + (f"; blockers: {'; '.join(quoted(b) for b in blockers)}"
                                                      if blockers else ""),
        f"SOP session {session.session_id}, each step its own call:",
        *(line for step in session.steps for line in (f"  {step.step}  {step.tool.ljust(width)}  {quoted(step.result)}",
                                                      *figure_rows(step.figures, " " * 6))),
        f"Evidence pack {quoted(pack.get('pack_id'))}: {quoted(pack.get('report_html'))}",
        f"A human decides it: {quoted(pack.get('approve_command'))} (signed with their SSH key), or trainops "
        f"reject {quoted(pack.get('pack_id'))} --note WHY.",
    ])


def figure_rows(figures: list[sop_session.StepFigure], indent: str = "") -> list[str]:
    """A step's figures as the rows of a table: | figure | value |, the names padded to one column."""
    width = max((len(f.name) for f in figures), default=0)
    return [f"{indent}| {quoted(f.name).ljust(width)} | {quoted(f.value)} |" for f in figures]
