"""The request kinds the agent knows, declared once as data: act, subject, the concepts that cue it (a
question or plan) or the verbs that order it, what it needs named, the tools it reads (and offers a model),
its skill, and how the offline policy (agents/policy.py) answers it: its steps and answer, or a plan of its
own. Adding a kind is one entry; agents/understand.py picks the first that fits. Nothing here reads text.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainops.agents import diagnose, explain, sop_chat, sop_walk
from trainops.skills.sop_steps import SKILL as SOP_SKILL

if TYPE_CHECKING:
    from trainops.agents.understand import Entities


@dataclass(frozen=True)
class Kind:
    name: str
    act: str  # question | order | plan
    subject: str
    tools: tuple[str, ...]
    steps: tuple[str, ...] = ()  # called in order; "?" marks a step skipped when its tool or input is missing
    answer: Callable | None = None  # (request, outputs by tool) -> text or a final_answer's arguments
    plan: Callable | None = None  # (kind, request, calls made, results, schemas) -> the next call or the answer
    cues: tuple[frozenset[str], ...] = ()  # alternatives; each must meet the request's concepts
    unless: frozenset[str] = frozenset()
    needs: str = ""  # entity | two_runs | none | "" (anything)
    order: str | None = None
    skill: str | None = None
    verbs: tuple[str, ...] = ()  # an order's: "verb concept[ another concept the request must hold]"
    acts: tuple[str, ...] = ()  # an order's further tools that change the world, each through the gate
    bare: tuple[str, ...] = ()  # an order's verbs that order it standing alone, with no object ("go on")

    def acting(self) -> tuple[str, ...]:
        """The tools this kind may call that change the world: its order's and its further steps'."""
        return (self.order, *self.acts) if self.order else ()


def _cue(*alternatives: str) -> tuple[frozenset[str], ...]:
    return tuple(frozenset(a.split()) for a in alternatives)


DIAGNOSIS_TOOLS = ("load_skill", "list_interruptions", "grep_log", "read_log_window", "job_status", "list_jobs",
                   "find_straggler", "sdc_case", "list_checkpoints", "effective_training_time")
ORDER_READS = ("job_status", "list_nodes", "list_jobs")
KINDS: tuple[Kind, ...] = (
    Kind("cancel", "order", "job", (*ORDER_READS, "cancel_job"), ("job_status", "cancel_job"), order="cancel_job",
         verbs=("cancel",)),
    Kind("requeue", "order", "job", (*ORDER_READS, "requeue_job", "list_interruptions"), ("job_status", "requeue_job"),
         order="requeue_job", verbs=("requeue", "resume")),
    Kind("drain", "order", "node", (*ORDER_READS, "drain_node"), ("job_status?", "list_nodes", "drain_node"),
         order="drain_node", verbs=("drain", "take drain")),
    Kind("resume_node", "order", "node", (*ORDER_READS, "resume_node"), ("list_nodes", "resume_node"),
         order="resume_node", verbs=("resume node", "take resume")),
    Kind("quarantine", "order", "checkpoint", ("list_checkpoints", "verify_checkpoint", "quarantine_checkpoints"),
         order="quarantine_checkpoints", verbs=("quarantine",)),
    Kind("quota", "order", "quota", ("set_tenant_quota",), order="set_tenant_quota", verbs=("grant quota",)),
    Kind("scheduler_policy", "order", "policy", ("change_scheduler_policy",), order="change_scheduler_policy",
         verbs=("change policy",)),
    Kind("rollback", "order", "change", ("rollback_change",), order="rollback_change", verbs=("rollback",)),
    Kind("upgrade", "order", "framework", ("upgrade_framework", "check_framework_job", "framework_knobs"),
         order="upgrade_framework", verbs=("upgrade",)),
    Kind("sop", "order", "pack", (*sop_walk.STEPS, "sop_steer"), plan=sop_walk.plan, order=sop_walk.DECLARE,
         acts=(*sop_walk.STEPS[1:], "sop_steer"),
         skill=SOP_SKILL, verbs=("launch sop",)),
    Kind("sop_steer", "order", "pack", ("sop_steer",), plan=sop_chat.steer, order="sop_steer", skill=SOP_SKILL,
         verbs=("add arm", "add drill", "skip arm", "skip drill", "skip sopstep", "cancel after sopstep")),
    Kind("sop_resume", "order", "pack", (*sop_walk.STEPS[1:], "sop_steer"), plan=sop_chat.resume, order=sop_walk.PACK,
         acts=(*sop_walk.STEPS[1:-1], "sop_steer"), skill=SOP_SKILL, verbs=("proceed sop", "proceed sopstep"),
         bare=("proceed",)),
    Kind("drill", "order", "drill", ("job_status", "inject_fault", "detect_faults"),
         ("job_status?", "inject_fault", "detect_faults?"), explain.drill, order="inject_fault", skill="fault-drill",
         verbs=("inject", "launch drill", "slow rank")),
    Kind("approvals", "question", "approval", ("list_pending_approvals",), ("list_pending_approvals",),
         explain.approvals, cues=_cue("approval")),
    Kind("checkpoint_interval", "plan", "checkpoint", ("plan_checkpoint_interval", "measure_checkpoint_io"),
         ("plan_checkpoint_interval",), explain.checkpoint_interval, cues=_cue("checkpoint interval"),
         skill="checkpoint-plan"),
    Kind("compare", "question", "run", ("compare_runs", "summarize_run", "query_metrics"), ("compare_runs",),
         explain.compare, cues=_cue("compare", "mfu", "slow"), needs="two_runs"),
    Kind("checkpoints", "question", "checkpoint", ("list_checkpoints", "grep_log", "verify_checkpoint"),
         plan=diagnose.checkpoints, cues=_cue("checkpoint"), unless=frozenset({"lost"}), needs="entity"),
    Kind("time_lost", "question", "job", DIAGNOSIS_TOOLS, answer=diagnose.time_lost, plan=diagnose.plan,
         cues=_cue("lost time"), needs="entity", skill="fault-drill"),
    Kind("straggler", "question", "rank", DIAGNOSIS_TOOLS, ("find_straggler",), diagnose.straggler, diagnose.plan,
         _cue("straggler", "slow rank"), needs="entity", skill="fault-drill"),
    Kind("mfu", "question", "mfu", ("summarize_run", "plan_layout", "declare_environment", "query_metrics"),
         ("summarize_run", "plan_layout?", "declare_environment?"), explain.mfu, cues=_cue("mfu"), needs="entity",
         skill="baseline"),
    Kind("logs", "question", "job", ("job_logs", "grep_log", "read_log_window"), ("job_logs",), explain.logs,
         cues=_cue("log"), unless=frozenset({"why", "trouble"}), needs="entity"),
    Kind("diagnose", "question", "job", DIAGNOSIS_TOOLS, plan=diagnose.plan, needs="entity", skill="fault-drill"),
    Kind("jobs", "question", "job", ("list_jobs", "job_status"), ("list_jobs",), explain.listing,
         cues=_cue("jobs", "job"), needs="none"),
    Kind("nodes", "question", "node", ("list_nodes",), ("list_nodes",), explain.listing, cues=_cue("nodes", "node"),
         needs="none"),
    Kind("symptom", "question", "job", (*DIAGNOSIS_TOOLS, "summarize_run"), ("list_jobs", "list_interruptions"),
         diagnose.symptom, cues=_cue("trouble", "why", "slow"), needs="none"),
)
BY_NAME = {kind.name: kind for kind in KINDS}
ORDER_VERBS = frozenset(verb.split()[0] for kind in KINDS for verb in (*kind.verbs, *kind.bare))
BARE_VERBS = frozenset(verb.split()[0] for kind in KINDS for verb in kind.bare)
# A request of no known kind: a model may still read, never act.
GENERAL_READS = ("list_jobs", "job_status", "list_interruptions", "grep_log", "summarize_run", "list_checkpoints",
                 "list_nodes", "list_pending_approvals", "find_straggler", "compare_runs", "load_skill")


def ordered_tool(lead: set[str], seen: set[str], found: Entities, bare: bool = False) -> str | None:
    """The tool a sentence led by a verb of `lead` orders: a verb with the concept it needs before a bare one
    ("resume node n2" before "resume job 4"); with no object ("go on"), only a kind it orders standing alone."""
    held = (seen | ({"node"} if found.nodes else set()) | ({"quota"} if found.tenant else set())
            | ({"arm"} if found.arms else set()))
    fits = [(kind.order, also) for kind in KINDS for verb, *also in map(str.split, kind.bare if bare else kind.verbs)
            if verb in lead and set(also) <= held]
    return next((tool for tool, _ in sorted(fits, key=lambda fit: not fit[1])), None)


def _fits(kind: Kind, seen: set[str], found: Entities) -> bool:
    named = bool(found.jobs or found.runs or found.nodes)  # a kind its cues name but not its entity says what's missing
    if kind.needs == "entity" and not named and not kind.cues or kind.needs == "none" and named:
        return False
    if kind.needs == "two_runs" and len(found.runs) < 2 or kind.unless & seen:
        return False
    return not kind.cues or any(cue <= seen for cue in kind.cues)


def choose(order: str | None, seen: set[str], found: Entities) -> Kind | None:
    """The request's kind: the order's, else the first question or plan whose cues and needs fit."""
    if order:
        return next(k for k in KINDS if k.order == order)
    return next((k for k in KINDS if k.act != "order" and _fits(k, seen, found)), None)


def offered(kind: Kind | None, act: str, risk: dict[str, str]) -> list[str]:
    """The tools a model is offered for this request: its kind's, and for a question the read-only ones only."""
    names = kind.tools if kind else GENERAL_READS
    if "load_skill" not in names:  # every skill's name is in the prompt; its body is one read away
        names = ("load_skill", *names)
    return [n for n in names if n in risk and (risk[n] == "read" or (act == "order" and kind and n in kind.acting()))]


def may_act(request: dict | None, tool: str) -> bool:
    """Whether a request (as the graph stores it) orders `tool`: its order's, or a later step of that order."""
    kind = BY_NAME.get((request or {}).get("kind") or "")
    return bool(request and request.get("act") == "order" and kind and tool in kind.acting()
                and request.get("order") == kind.order)
