"""`trainops changes` and `trainops rollback CHANGE`: the recorded scheduler changes (partition
policies, tenant quotas) and their undoing through the gated rollback_change tool, which the
human approves for the exact restore commands shown here."""
from __future__ import annotations

from typing import Any, Optional

import typer

from trainops.commands.tools import run_tool
from trainops.output import console, emit, fail
from trainops.tools.changes.records import list_changes, read_change

app = typer.Typer()


def _render_changes(rows: list[dict[str, Any]]) -> None:
    out = console()
    if not rows:
        out.print("no changes recorded", highlight=False)
    for row in rows:
        state = "rolled back" if row["rolled_back_at"] else "in effect"
        out.print(f"{row['id']} {row['kind']} {row['target']}: {state}", highlight=False, markup=False)


@app.command("changes")
def changes(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List the recorded scheduler changes, oldest first, and whether each was rolled back."""
    emit([record.model_dump(mode="json") for record in list_changes()], as_json, _render_changes)


def _render_rollback(result: dict[str, Any]) -> None:
    out = console()
    for argv in result["ran"]:
        out.print("ran: " + " ".join(argv), highlight=False, markup=False)
    if result["restored"]:
        out.print(f"{result['target']} is back as change {result['change_id']} recorded it",
                  highlight=False, markup=False)
    else:
        out.print(f"{result['target']} differs from the recorded state:", highlight=False, markup=False)
        for line in result["differences"]:
            out.print(f"  {line}", highlight=False, markup=False)


@app.command("rollback")
def rollback(
    change_id: str = typer.Argument(..., help="The change to undo (`trainops changes` lists them)."),
    approval_token: Optional[str] = typer.Option(None, "--approval-token",
                                                 help="The signed approval of this exact rollback."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Undo a recorded change: run its restore commands (the approver signs exactly these) and check
    the scheduler shows the recorded previous state again, field by field. Without a token the
    rollback is queued for approval and the command says how to approve it."""
    try:
        record = read_change(change_id)
    except ValueError as exc:
        fail(str(exc), as_json=as_json)
    if not as_json:
        for argv in record.rollback_commands:
            console().print("restore: " + " ".join(argv), highlight=False, markup=False)
    out = run_tool("rollback_change", {"change_id": record.id, "commands": record.rollback_commands}, as_json,
                   approval_token)
    emit(out.model_dump(mode="json"), as_json, _render_rollback)
    if not out.restored:
        raise typer.Exit(1)
