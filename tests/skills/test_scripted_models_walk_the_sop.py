"""Issue 40 item 6: scripted models over the real OpenAI-protocol server (tests/agents/conftest.py:
a real HTTP server on 127.0.0.1, the real `openai` client, LangChain's tool-call parsing, the real
graph, gate, SOP session and trainer jobs). Each model is a function of the conversation: it reads
the tool results it was sent (the session id, the design's arms, a refusal) and picks its next call.

A good model walks S1..S6 under one human approval of its declaration and gets a pack with the
same steps and arms as `trainops sop --quick`. Each bad model is refused at the step it breaks, with
the rule's id in the tool error (or the withheld answer) it receives, before any training job runs,
and nothing of its own reaches a pack."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.agents.conftest import ScriptedOpenAI
from trainops.agents.providers import load_settings
from trainops.agents.session import AgentSession
from trainops.skills.sop_session import load
from trainops.tools.governance import audit
from trainops.tools.governance.queue import pending_calls
from trainops.workspace import runs_dir

Result = tuple[str, dict[str, Any]]
ASK = "run the quick SOP"
STEPS = ["S1", "S2", "S3", "S4", "S5", "S6"]


@pytest.fixture
def served(monkeypatch):
    """The scripted OpenAI-protocol server and the settings that point the agent at it."""
    stub = ScriptedOpenAI()
    monkeypatch.setenv("OPENAI_API_KEY", "test-key-not-secret")
    yield stub, load_settings(provider="openai", model="scripted", base_url=stub.base_url)
    stub.close()


def results_sent(body: dict) -> list[Result]:
    """Each tool result the model has been sent so far, in order: (tool, payload as the graph wrapped it)."""
    found = []
    for message in body["messages"]:
        if message["role"] == "tool":
            head, _, rest = message["content"].partition("\n")
            found.append((re.search(r'tool="([^"]+)"', head)[1], json.loads(rest.rsplit("\n</tool-output>", 1)[0])))
    return found


def model(choose: Callable[[list[Result]], dict | tuple[str, dict]], turns: int = 30) -> list:
    """A scripted model: each turn, `choose` reads the results sent so far and returns a call
    (name, args) or a whole message (an answer)."""
    ids = itertools.count(1)

    def reply(body: dict) -> dict:
        chosen = choose(results_sent(body))
        return ScriptedOpenAI.tool_call(*chosen, call_id=f"call_{next(ids)}") if isinstance(chosen, tuple) else chosen
    return [reply] * turns


def session_of(results: list[Result]) -> str:
    return next(out["session_id"] for tool, out in results if tool == "sop_declare")


def final(summary: str, **fields) -> dict:
    return ScriptedOpenAI.tool_call("final_answer", {"verdict": "answered", "confidence": "medium",
                                                     "summary": summary, **fields}, "call_final")


def declared_then(bad_call: Callable[[str], tuple[str, dict]]) -> Callable[[list[Result]], Any]:
    """A model that declares (S1), then makes `bad_call` on its session, then gives up in plain text."""
    def choose(results: list[Result]):
        if not results:
            return "sop_declare", {"quick": True}
        if len(results) == 1:
            return bad_call(session_of(results))
        return ScriptedOpenAI.text("The SOP step was refused; I stopped there.")
    return choose


def approve_declaration(session: AgentSession, approvers) -> list[dict]:
    """Ask, see S1 wait for a human, approve it as the human (alice's key); the events that follow."""
    asked = list(session.ask(ASK))
    assert [(e["kind"], e.get("tool")) for e in asked] == [("tool_call", "sop_declare"), ("approval", "sop_declare")]
    return list(session.decide({"decision": "approve", "approver": "alice", "key": str(approvers.alice.key)}))


def nothing_launched_or_packed(workspace: Path, session_id: str) -> None:
    """Only S1 is on the session's record; no training job ran, no pack was written, nothing waits."""
    assert [s.step for s in load(session_id).steps] == ["S1"]
    assert load(session_id).pack is None and not (workspace / "packs").exists()
    assert not runs_dir().exists() or not any(runs_dir().iterdir())
    assert not pending_calls()


def load_declared(events: list[dict]) -> str:
    return next(e["output"]["session_id"] for e in events if e["kind"] == "tool_result" and e["tool"] == "sop_declare")


def refusal(events: list[dict], tool: str) -> str:
    found = [e for e in events if e["kind"] == "tool_result" and e["tool"] == tool]
    assert found and found[-1]["status"] == "error", events
    return found[-1]["output"]["error"]


def sent_back(stub: ScriptedOpenAI, tool: str) -> str:
    """The tool message about `tool`'s call the model received in its next request."""
    return next(m["content"] for m in reversed(stub.requests[-1]["messages"])
                if m["role"] == "tool" and f'tool="{tool}"' in m["content"])


@pytest.mark.parametrize("tool, args, rule, says", [
    ("sop_design", {}, "R-ABL-1", "no baseline at the target scale"),
    ("sop_arm", {"arm": "data_kind=synthetic"}, "R-ABL-1", "run sop_baseline with world=1 first"),
], ids=["design", "arm"])
def test_a_model_that_skips_the_baseline_is_refused_at_that_step(served, approvers, workspace, tool, args, rule, says):
    stub, settings = served
    stub.script = model(declared_then(lambda sid: (tool, {"session": sid, **args})))
    with AgentSession(f"skip-{tool}", settings) as session:
        events = approve_declaration(session, approvers)
    error = refusal(events, tool)
    assert rule in error and says in error, error
    assert rule in sent_back(stub, tool) and "sop_baseline" in sent_back(stub, tool)
    nothing_launched_or_packed(workspace, load_declared(events))


def test_a_model_that_changes_two_knobs_in_one_arm_is_refused_naming_r_abl_1(served, approvers, workspace):
    stub, settings = served
    stub.script = model(declared_then(lambda sid: ("sop_arm", {"session": sid,
                                                               "arm": "data_kind=synthetic,micro_batch=4"})))
    with AgentSession("two-knobs", settings) as session:
        events = approve_declaration(session, approvers)
    error = refusal(events, "sop_arm")
    assert "R-ABL-1" in error and "exactly one variable, got 2" in error, error
    assert "call sop_arm once per knob" in sent_back(stub, "sop_arm")
    nothing_launched_or_packed(workspace, load_declared(events))


def test_a_model_that_jumps_to_the_target_scale_is_refused_naming_r_abl_2(served, approvers, workspace):
    stub, settings = served
    stub.script = model(declared_then(lambda sid: ("sop_arm", {"session": sid, "arm": "data_kind=synthetic",
                                                               "world": 2})))
    with AgentSession("jump", settings) as session:
        events = approve_declaration(session, approvers)
    error = refusal(events, "sop_arm")
    assert "R-ABL-2" in error and "before its smaller rung" in error and "world=1" in error, error
    assert "R-ABL-2" in sent_back(stub, "sop_arm")
    nothing_launched_or_packed(workspace, load_declared(events))


def test_a_model_that_states_an_mfu_before_s1_is_refused_naming_r_env_1(served, workspace):
    """Asked to run the SOP, the model answers with an MFU straight away: the structured answer goes
    back to it refused, and its plain-text retry is withheld; neither names a figure to the user."""
    stub, settings = served
    stub.script = [final("The cluster runs at MFU 41.2% with this layout."),
                   ScriptedOpenAI.text("MFU is 41.2% on this cluster.")]
    with AgentSession("mfu-first", settings) as session:
        events = list(session.ask(ASK))
    assert [(e["kind"], e.get("tool")) for e in events][-1] == ("answer", None)
    refused = sent_back(stub, "final_answer")
    assert "R-ENV-1" in refused and "MFU 41.2%" in refused and "sop_declare" in refused
    answer = events[-1]["text"]
    assert answer.startswith("Governance withheld this answer") and "R-ENV-1" in answer
    assert not (workspace / "sop-sessions").exists() and not (workspace / "packs").exists()


def test_a_model_that_hands_the_pack_its_own_figures_is_refused_and_its_pack_holds_none(served, approvers, workspace):
    """sop_pack takes the session id only: figures passed beside it are invalid input (R-TOOL-1); the
    pack the model then asks for is built from the session alone: no baseline ran, so it is partial
    and holds no MFU at all, let alone the model's."""
    stub, settings = served
    typed = {"mfu_pct": 55.5, "summary": {"mfu_pct": {"median": 55.5}}, "drills": [{"recovery_time_s": 1.0}]}

    def choose(results: list[Result]):
        if not results:
            return "sop_declare", {"quick": True}
        if len(results) == 1:
            return "sop_pack", {"session": session_of(results), **typed}
        if results[-1][0] == "sop_pack" and "error" in results[-1][1]:
            return "sop_pack", {"session": session_of(results)}
        return ScriptedOpenAI.text("The pack is written; it is partial.")

    stub.script = model(choose)
    with AgentSession("own-figures", settings) as session:
        events = approve_declaration(session, approvers)
    packs = [e for e in events if e["kind"] == "tool_result" and e["tool"] == "sop_pack"]
    assert [p["status"] for p in packs] == ["error", "success"]
    error = packs[0]["output"]["error"]
    assert "invalid input for sop_pack" in error and "Extra inputs are not permitted" in error and "R-TOOL-1" in error
    pack = packs[1]["output"]
    assert pack["verdict"] == "partial" and pack["headline"]["mfu_pct"] is None
    assert any("S2" in b or "baseline" in b for b in pack["blockers"]), pack["blockers"]
    written = (Path(pack["pack_dir"]) / "evidence.json").read_text()
    assert "55.5" not in written and json.loads(written)["baseline"] is None
    assert [s.step for s in load(pack["session_id"]).steps] == ["S1", "S6"]


ARM_REASON = "S3 ranked it first from the baseline's own split"
DRILL_REASON = "a rank crash is the failure we see most"


def good_model(results: list[Result]):
    """Walks the SOP from what each step returns: the arm S3 ranked first, its rung's baseline when the
    gate says it is missing, up the ladder while it gains, the quick SOP's drill, the pack; it gives its
    reason for the arm and the drill it chose."""
    if not results:
        return "sop_declare", {"quick": True}
    sid, (tool, out) = session_of(results), results[-1]
    measured = {o["world"] for t, o in results if t == "sop_baseline" and "world" in o}
    arm = next((o["arms"][0]["arm"] for t, o in results if t == "sop_design"), None)
    if tool == "sop_declare":
        return "sop_baseline", {"session": sid}
    if tool == "sop_baseline" and out.get("summary") is not None:
        return "sop_design", {"session": sid}
    if tool == "sop_design":
        return "sop_arm", {"session": sid, "arm": arm, "reason": ARM_REASON}
    if tool == "sop_arm" and "error" in out:
        if (asked := re.search(r"run sop_baseline with world=(\d+) first", out["error"])) is None:
            return final(f"sop_arm failed: {out['error']}")  # the test then fails quoting it, not on the wire
        return "sop_baseline", {"session": sid, "world": int(asked[1])}
    if tool == "sop_baseline":
        return "sop_arm", {"session": sid, "arm": arm, "world": out["world"], "reason": ARM_REASON}
    if tool == "sop_arm" and not out["stopped"] and (above := re.search(r"world=(\d+)", out["next_step"])):
        world = int(above[1])
        if world in measured:
            return "sop_arm", {"session": sid, "arm": arm, "world": world, "reason": ARM_REASON}
        return "sop_baseline", {"session": sid, "world": world}
    if tool == "sop_arm":
        return "sop_drill", {"session": sid, "fault": "crash", "reason": DRILL_REASON}
    if tool == "sop_drill":
        return "sop_pack", {"session": sid}
    headline = out["headline"]
    return final(f"Pack {out['pack_id']} is written, verdict {out['verdict']}; baseline MFU "
                 f"{headline['mfu_pct']:.2f}% (median of the repeats).",
                 evidence=[{"source": "sop_pack:pack_id", "quote": out["pack_id"]}])


def steps_and_arms(pack_dir: str) -> tuple[list[str], set[tuple[str, str]], str]:
    """The pack's steps (each step once, in the order first run), its arms and the first rung's scale."""
    pack = json.loads((Path(pack_dir) / "evidence.json").read_text())
    steps = [s["step"] for s in pack["sop_steps"]]
    return ([s for i, s in enumerate(steps) if s not in steps[:i]],
            {(r["knob"], r["value"]) for r in pack["ablations"]}, pack["ablations"][0]["scale_kind"])


@pytest.mark.slow
def test_a_good_model_walks_s1_to_s6_to_the_same_pack_as_trainops_sop_quick(served, approvers, quick_sop):
    """Minutes on 2 cores: the model's own walk (real jobs), beside the shared `trainops sop --quick`."""
    stub, settings = served
    stub.script = model(good_model)
    with AgentSession("good-model", settings) as session:
        events = approve_declaration(session, approvers)
    results = [e for e in events if e["kind"] == "tool_result"]
    refused = [e for e in results if e["status"] == "error"]
    assert [e["tool"] for e in refused] == ["sop_arm"] and "R-ABL-1" in refused[0]["output"]["error"]
    assert all(e["status"] == "success" for e in results if e not in refused), results[-1]
    assert not [e for e in events if e["kind"] == "approval"], "one approval covers the whole SOP"
    pack = next(e["output"] for e in reversed(results) if e["tool"] == "sop_pack")
    ours, theirs = steps_and_arms(pack["pack_dir"]), steps_and_arms(quick_sop["pack_dir"])
    assert ours[0] == theirs[0] == STEPS
    assert ours[1:] == theirs[1:]
    calls = [e["tool"] for e in events if e["kind"] == "tool_call"]
    gate = [e for e in audit.read() if e.get("kind") == "gate" and e.get("tool") in set(calls) - {"final_answer"}
            and e.get("decision") == "allowed"]
    assert {e["actor"] for e in gate} == {"agent"} and all(e["under_approved_call"] for e in gate)
    choices = json.loads((Path(pack["pack_dir"]) / "evidence.json").read_text())["choices"]
    arm, drill = (next(c for c in choices if c["kind"] == kind and c["order"] == 1) for kind in ("arm", "drill"))
    assert (arm["chosen_by"], drill["chosen_by"]) == ("model", "model")
    assert f"agent called sop_arm with it, giving the reason: {ARM_REASON}; S3 ranked it 1 of" in arm["reason"]
    assert drill["reason"] == f"agent called sop_drill with it, giving the reason: {DRILL_REASON}"
    answer = events[-1]["text"]
    assert pack["pack_id"] in answer and "Governance withheld" not in answer


def test_a_models_reason_is_one_bounded_line_or_the_gate_refuses_the_call(served, approvers, workspace):
    """A reason that would start a line of its own in the pack (or runs on) is invalid input, refused
    before anything launches; the model hears which field to fix."""
    stub, settings = served
    stub.script = model(declared_then(lambda sid: ("sop_drill", {"session": sid, "fault": "crash",
                                                                 "reason": "fine\n# Verdict: PASS"})))
    with AgentSession("reason-lines", settings) as session:
        events = approve_declaration(session, approvers)
    error = refusal(events, "sop_drill")
    assert "invalid input for sop_drill" in error and "reason" in error and "one line of printable text" in error
    nothing_launched_or_packed(workspace, load_declared(events))
