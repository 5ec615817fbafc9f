"""Steering and resuming the SOP from the chat thread that started it (issue 40 items 4-5): the
"sop_steer" and "sop_resume" kinds' plans (agents/kinds.py).

The SOP a line means is the thread's own: the session its latest `sop_declare` returned, read from the
thread's tool results (`thread_sessions`, put on the request as `entities.sop_session`), never an id a
model types or one read from a file a job could write. A model's SOP call on another session is refused
before the gate (`not_this_threads`).

A steer is one typed `sop_steer` call, read from the request as understood: its verb's concept (add,
skip, stop ... after) and what it names (an arm, a fault, a step), with the person's own words, made
inert and bounded, as its reason. The gate decides it like any change the agent asks for: a human
approves it, and one that breaks a rule (two knobs in one arm, skipping S1) is refused with the rule's
id, which the answer quotes. "go on" walks the session on from its next step (skills.sop.next_step, as
`trainops sop --resume ID` does): what finished is not run again.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainops.agents import sop_walk
from trainops.agents.explain import Next, quoted
from trainops.tools.reliability.evidence import inert

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage, ToolMessage

    from trainops.agents.kinds import Kind
    from trainops.agents.understand import Request
    from trainops.skills.sop_session import SopSession

STEER = "sop_steer"
ON_A_SESSION = (*sop_walk.STEPS[1:], STEER)  # the SOP tools that act on a session S1 started
REASON_CHARS = 300
NO_SESSION = ("No SOP was started in this thread, so there is nothing to steer or go on with: ask me to run the SOP "
              "here (e.g. 'run the quick SOP'), or resume another one with `trainops sop --resume ID`.")


def thread_sessions(messages: list[BaseMessage]) -> list[str]:
    """The SOP sessions this thread's own sop_declare calls started, oldest first: from the results the
    gate's calls returned into the thread, nothing a model or a job wrote."""
    return [str(m.artifact["session_id"]) for m in messages
            if getattr(m, "type", "") == "tool" and m.name == sop_walk.DECLARE and m.status == "success"
            and isinstance(m.artifact, dict) and m.artifact.get("session_id")]


def not_this_threads(tool: str, args: dict[str, Any], messages: list[BaseMessage]) -> str | None:
    """Why the agent's call of an SOP tool on a session this thread did not start is refused, or None."""
    if tool not in ON_A_SESSION or "session" not in args:
        return None
    own = thread_sessions(messages)
    if args["session"] in own:
        return None
    return (f"{tool}: session {quoted(args['session'], 80)} was not started in this thread; an SOP is steered and "
            f"walked from the thread whose sop_declare started it (this thread's: {', '.join(own) or 'none'})")


def _threads_session(request: Request) -> SopSession | str:
    """The thread's own SOP session, or the answer saying there is none to steer or go on with."""
    return sop_walk.session_of(request.entities.sop_session) if request.entities.sop_session else NO_SESSION


def change_of(request: Request) -> tuple[str, str] | None:
    """The one change to the plan the request asks for: stop after a step; skip an arm, a drill or a
    step; add an arm or a drill. Every arm it names goes into one arm (the gate refuses two knobs)."""
    said, found = set(request.concepts), request.entities
    if {"cancel", "after"} <= said and found.sop_steps:
        return "stop_after", found.sop_steps[0]
    verb = "skip" if "skip" in said else "add" if "add" in said else None
    if verb and found.arms:
        return f"{verb}_arm", ",".join(found.arms)
    if verb and found.fault:
        return f"{verb}_drill", found.fault
    if verb == "skip" and found.sop_steps:
        return "skip_step", found.sop_steps[0]
    return None


def reason(request: Request) -> str:
    """The person's own words, on one line, their control and bidi characters shown as escapes, bounded."""
    return inert(" ".join(request.text.split()), REASON_CHARS)


def steer(kind: Kind, request: Request, done: dict[str, dict], results: list[ToolMessage],
          schemas: dict[str, dict]) -> Next:
    """One sop_steer call on the thread's SOP; then its outcome: the plan as it stands, or why not."""
    if results:
        return _steered(results[-1], done.get(STEER) or {})
    session = _threads_session(request)
    if isinstance(session, str):
        return session
    if session.pack is not None:
        return f"SOP session {session.session_id} is finished (its pack is {session.pack}): there is nothing to steer."
    change = change_of(request)
    if change is None:
        return ("I could not tell which change to the SOP you mean. Say e.g. 'also try activation checkpointing', "
                "'skip the crash drill', 'drop the ddp arm', 'no drills this time' or 'stop after the baseline'.")
    return STEER, {"session": session.session_id, "change": change[0], "value": change[1], "reason": reason(request)}


def _steered(result: ToolMessage, args: dict[str, Any]) -> str:
    data = result.artifact if isinstance(result.artifact, dict) else {}
    asked = f"{args.get('change')} {quoted(args.get('value'))}"
    if data.get("kind") == "pending":
        return (f"The steer ({asked}) waits for a human's approval as {data['pending_id']}; the plan is unchanged "
                f"until `trainops approve --pending {data['pending_id']}`.")
    if result.status != "success":
        return (f"The steer ({asked}) was not recorded: {quoted(data.get('error') or data, 1000)}. Nothing changed "
                "in the SOP's plan.")
    return "\n".join([
        f"Steer recorded on SOP session {quoted(data.get('session_id'))}: {asked}, because "
        f"{quoted(args.get('reason'))}.",
        "The plan now:",
        f"  S4 arms: {', '.join(quoted(a) for a in data.get('arms') or []) or 'none'}",
        f"  S5 drills: {', '.join(quoted(d) for d in data.get('drills') or []) or 'none'}",
        f"  the pack follows: {quoted(data.get('stops_after') or 'S5')}",
        "Say 'go on' to continue from the next step; the pack lists this steer with who asked and why.",
    ])


def resume(kind: Kind, request: Request, done: dict[str, dict], results: list[ToolMessage],
           schemas: dict[str, dict]) -> Next:
    """The thread's SOP from its next step to the pack, nothing that finished run again."""
    if failed := next((r for r in results if r.status == "error"), None):
        return sop_walk.stopped_at(failed)
    session = _threads_session(request)
    if not results and not isinstance(session, str) and session.pack is not None:
        return (f"SOP session {session.session_id} is finished: its pack is {session.pack}. To run the SOP again, ask "
                "me to run it (a new session).")
    return sop_walk.walk(session, results, schemas)
