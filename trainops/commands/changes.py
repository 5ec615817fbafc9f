"""`trainops changes` and `trainops rollback CHANGE`: the recorded scheduler changes (partition
policies, tenant quotas) and their undoing through the gated rollback_change tool, which the
human approves for the exact restore commands shown here; the framework and library changes
between approved baselines, and `trainops known-issue`, a person's note against a version."""
from __future__ import annotations

import getpass
import os
from typing import Any, Optional

import typer
from pydantic import ValidationError

from trainops.commands.tools import run_tool
from trainops.output import console, emit, fail
from trainops.tools.changes import framework, known_issues
from trainops.tools.changes.records import ChangeRecord, list_changes, read_change, review_lines

app = typer.Typer()


def _render_changes(rows: list[dict[str, Any]]) -> None:
    out = console()
    if not rows:
        out.print("no changes recorded", highlight=False)
    for row in rows:
        for line in review_lines(ChangeRecord.model_validate(row)):
            out.print(line, highlight=False, markup=False)


def _render_framework(found: dict[str, Any]) -> None:
    out = console()
    rows = found["baseline_changes"]
    out.print("framework and library changes between approved baselines:" if rows else
              "no framework or library change between approved baselines", highlight=False, markup=False)
    for row in rows:
        moved = ", ".join(f"{c['component']} {c['before']} -> {c['after']}" for c in row["changes"])
        out.print(f"  {row['pack']} (since {row['since_pack']}): {moved}", highlight=False, markup=False)
    for issue in found["known_issues"]:
        out.print(f"known issue: {issue['component']} {issue['versions']}: {issue['text']} ({issue['added_by']})",
                  highlight=False, markup=False)


@app.command("changes")
def changes(
    frameworks: bool = typer.Option(False, "--framework",
                                    help="Framework and library upgrades between approved baselines, and known "
                                         "issues, instead of scheduler changes."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List the recorded scheduler changes, oldest first, and whether each was rolled back."""
    if frameworks:
        found = {"baseline_changes": [c.model_dump(mode="json") for c in framework.baseline_history()],
                 "known_issues": [i.model_dump(mode="json") for i in known_issues.known_issues()]}
        emit(found, as_json, _render_framework)
        return
    emit([record.model_dump(mode="json") for record in list_changes()], as_json, _render_changes)


@app.command("known-issue")
def known_issue(
    component: str = typer.Argument(..., help="torch, scheduler, trainops, or a framework's name (deepspeed...)."),
    versions: str = typer.Argument(..., help="The version or its prefix it affects: 2.13 covers 2.13.0 and 2.13.1."),
    text: str = typer.Argument(..., help="What goes wrong, and the workaround if known (one line)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Record a known issue against a version: S1, the evidence pack and the agent show it beside
    any declaration with that version."""
    try:
        issue = known_issues.KnownIssue(component=component.lower(), versions=versions, text=text)
    except ValidationError as exc:
        fail("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
             + " (component: a name such as torch or deepspeed; versions: a version or its prefix such as 2.13; "
               "text: one printable line of at most 500 characters)", as_json=as_json)
    recorded = known_issues.add_known_issue(issue, os.environ.get("TRAINOPS_APPROVER") or getpass.getuser())
    emit(recorded.model_dump(mode="json"), as_json,
         lambda r: console().print(f"recorded: {r['component']} {r['versions']}: {r['text']}", highlight=False,
                                   markup=False))


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
