"""The `trainops` command line: wiring only. Each area is a module-level Typer app in
`trainops/commands/` whose commands can be imported and tested alone; those modules import torch,
LangGraph and LangChain inside the commands that need them, so `trainops --help` starts fast."""
from __future__ import annotations

import typer

from trainops.commands import agent, bench, changes, governance, reliability, sandbox, sop, tools, train, watch
from trainops.commands import eval as agent_eval

app = typer.Typer(
    name="trainops",
    help="Run LLM training the way the best infra teams do: declare, baseline, ablate, drill, approve.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _agent_registry():
    from trainops.agents.agent_tools import agent_registry

    return agent_registry()


@app.callback()
def _as_operator(ctx: typer.Context) -> None:
    """A command line is a human at a terminal: tool calls a command makes without naming an actor
    are the operator's (the agent's calls inside `chat`/`ask` still name the agent); and every
    command serves the one registry the agent uses, built when first needed."""
    from trainops.tools.base import operator_session
    from trainops.tools.registry import serving

    _private_files()
    ctx.with_resource(operator_session())
    ctx.with_resource(serving(_agent_registry))


def _private_files() -> None:
    """Every file this command (and each job it launches, which inherits the umask) creates is the
    user's alone; a workspace others can already read is reported once, on stderr."""
    import os
    import sys

    from trainops.workspace import PRIVATE_UMASK, exposed_workspace

    os.umask(PRIVATE_UMASK)
    if (warning := exposed_workspace()) is not None:
        sys.stderr.write(warning + "\n")


# each a module-level Typer app, merged at the top
for area in (train, tools, sop, governance, agent, bench, watch, reliability, changes):
    app.add_typer(area.app)
app.add_typer(sandbox.app, name="sandbox")
app.add_typer(agent_eval.app, name="eval")


def main() -> None:
    app()
