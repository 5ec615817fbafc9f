"""The `trainops` command line: wiring only. Each area registers its commands from
`trainops/commands/`; those modules import torch, LangGraph and LangChain inside the
commands that need them, so `trainops --help` starts fast."""
from __future__ import annotations

import typer

from trainops.commands import agent, bench, governance, sandbox, sop, tools, train

app = typer.Typer(
    name="trainops",
    help="Run LLM training the way the best infra teams do: declare, baseline, ablate, drill, approve.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

for area in (train, tools, sop, governance, agent, bench):
    area.register(app)
app.add_typer(sandbox.app, name="sandbox")


def main() -> None:
    app()
