"""The `trainops` command line: wiring only.

Each area is a module-level Typer app in `trainops/commands/` whose commands can be imported and
tested alone. `COMMANDS` below names every command once, with the module that holds it and the
summary `trainops --help` shows; the module is imported only when its command runs (click's lazy
group), so `trainops --help` imports no command module, and a command imports only its own area
(tests/tools/test_cli_tools.py holds the summaries to the commands' own help).
"""
from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass

import typer
from typer.core import TyperCommand, TyperGroup

from trainops.tools.context import operator_session, serving
from trainops.workspace import PRIVATE_UMASK, exposed_workspace


@dataclass(frozen=True)
class Entry:
    name: str
    area: str  # trainops.commands.<area>: its `app` holds the command (or, for a group area, is it)
    summary: str  # the first paragraph of the command's help, as `trainops --help` lists it
    group: bool = False  # the area's whole app is this command's sub-commands (`trainops sandbox up`)


COMMANDS = (
    Entry("train", "train", "Train with torchrun here (gloo on CPU, NCCL on GPU), launched through the governance "
                            "gate: per-step MFU lines, the run folder, non-zero exit on failure."),
    Entry("export", "train", "Write a run's checkpoint (any layout) as a Hugging Face Llama folder: config.json + "
                             "safetensors."),
    Entry("env", "tools", "Declare the environment (SOP S1): hardware, versions, scheduler, measured bandwidth and "
                          "peak. Options left out take declare_environment's defaults."),
    Entry("tool", "tools", "The typed tools: list them, show their schemas, call one."),
    Entry("plan", "tools", "Planning: checkpoint interval, effective training time, parallel layout."),
    Entry("baseline", "sop", "S2: repeats of the unchanged config; median and spread of step time, tokens/s, MFU, "
                             "labelled from the config the runs used and the environment declaration the command "
                             "makes first."),
    Entry("ablate", "sop", "S3/S4: single-variable arms up the rollout ladder, 1 -> 2 -> ... -> --nproc processes, "
                           "then nodes, each rung at the target's per-rank batch against the baseline at that rung; "
                           "the first rung where the gain is gone stops the ladder, reverts, verifies and hands the "
                           "stop to a human."),
    Entry("drill", "sop", "S5: inject, detect, isolate, restart from the newest good checkpoint; time each phase."),
    Entry("sop", "sop", "S1..S6 end to end; ends with an evidence pack waiting for approval."),
    Entry("evidence", "sop", "Evidence packs: build from runs, show."),
    Entry("skill", "sop", "Skills: list, show, run a SKILL.md step by step."),
    Entry("rules", "rules", "List every AGENTS.md rule ID and the code that enforces it; R-CHG-1 also shows "
                                 "the configured change windows (`state`) and whether now is inside one."),
    Entry("approve", "governance", "Approve an evidence pack, or sign a single-use token for one queued gated "
                                   "call."),
    Entry("reject", "governance", "Reject an evidence pack or a queued gated call, with a reason, signed with your "
                                  "key."),
    Entry("approvals", "governance", "Pending and decided approvals; `verify PACK` checks a signed decision."),
    Entry("audit", "governance", "The hash-chained, signature-anchored audit log."),
    Entry("chat", "agent", "Talk to the ops agent; the thread persists, gated actions ask you inline. /exit leaves."),
    Entry("ask", "agent", "One question, no prompts: a gated action becomes a pending approval instead of running."),
    Entry("threads", "agent", "List the ops agent's conversation threads, newest first."),
    Entry("bench", "bench", "Run the performance suite and rewrite benchmarks/RESULTS.md (side-by-side ratios)."),
    Entry("watch", "watch", "Watch a running job and escalate what R-ESC-1..4 say a human must decide."),
    Entry("sdc-check", "sdc", "The fleet known-answer SDC check through the scheduler, every --every-min (or [sdc] "
                              "interval_min) minutes; a failing node is drained and handed to a human."),
    Entry("interruptions", "reliability", "List the interruption record: each job end that was not a clean finish, "
                                          "its cause and evidence."),
    Entry("ettr", "reliability", "Effective training time per window from the interruption record, with MTBF and "
                                 "recovery time."),
    Entry("changes", "changes", "List the recorded scheduler changes, oldest first, and whether each was rolled "
                                "back."),
    Entry("known-issue", "changes", "Record a known issue against a version: S1, the evidence pack and the agent "
                                    "show it beside any declaration with that version."),
    Entry("rollback", "changes", "Undo a recorded change: run its restore commands (the approver signs exactly "
                                 "these) and check the scheduler shows the recorded previous state again, field by "
                                 "field. Without a token the rollback is queued for approval and the command says "
                                 "how to approve it."),
    Entry("sandbox", "sandbox", "A real Slurm cluster of network-namespace nodes on this host (root, Linux).",
          group=True),
    Entry("eval", "eval", "The agent benchmark: recorded scenarios, replayed and scored (pass@1, pass^k).",
          group=True),
)
BY_NAME = {entry.name: entry for entry in COMMANDS}
# the registry every command serves (the agent's, a superset of the tools'): built when a call first needs it
AGENT_REGISTRY = "trainops.agents.agent_tools"


def load_command(entry: Entry) -> TyperCommand | TyperGroup:
    """The real command behind `entry`: its area module imported now, not at start-up."""
    area = typer.main.get_group(importlib.import_module(f"trainops.commands.{entry.area}").app)
    if entry.group:
        area.name = entry.name
        return area
    return area.commands[entry.name]


class LazyGroup(TyperGroup):
    """Lists a stub per `COMMANDS` entry (its summary is all the root `--help` needs) and loads a
    command's module only when the command is asked for: to run it, show its help, or walk it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.listing = False
        for entry in COMMANDS:
            self.add_command(TyperCommand(entry.name, help=entry.summary))

    def get_command(self, ctx, name: str):
        if name not in BY_NAME:
            return None
        return self.commands[name] if self.listing else load_command(BY_NAME[name])

    def format_help(self, ctx, formatter) -> None:
        self.listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self.listing = False


app = typer.Typer(
    name="trainops",
    cls=LazyGroup,
    help="Run LLM training the way the best infra teams do: declare, baseline, ablate, drill, approve.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _agent_registry():
    return importlib.import_module(AGENT_REGISTRY).agent_registry()


@app.callback()
def _as_operator(ctx: typer.Context) -> None:
    """A command line is a human at a terminal: tool calls a command makes without naming an actor
    are the operator's (the agent's calls inside `chat`/`ask` still name the agent); and every
    command serves the one registry the agent uses, built when first needed."""
    _private_files()
    ctx.with_resource(operator_session())
    ctx.with_resource(serving(_agent_registry))


def _private_files() -> None:
    """Every file this command (and each job it launches, which inherits the umask) creates is the
    user's alone; a workspace others can already read is reported once, on stderr."""
    os.umask(PRIVATE_UMASK)
    if (warning := exposed_workspace()) is not None:
        sys.stderr.write(warning + "\n")


def main() -> None:
    app()
