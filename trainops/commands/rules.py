"""`trainops rules`: every AGENTS.md rule ID and the code that enforces it. Its own module, so listing
the rules loads the rules and the change windows, not the approvals, packs and tools beside them."""
from __future__ import annotations

from typing import Any

import typer

from trainops.output import emit, fail, say, table
from trainops.settings import SettingsError
from trainops.tools.governance import windows
from trainops.tools.governance.rules import list_rules

app = typer.Typer()
JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a table.")


@app.command("rules")
def rules(as_json: bool = JsonOpt) -> None:
    """List every AGENTS.md rule ID and the code that enforces it; R-CHG-1 also shows the configured
    change windows (`state`) and whether now is inside one."""
    try:
        change_windows = windows.status()
    except SettingsError as exc:
        fail(str(exc), as_json=as_json)
    listed = [{**r.model_dump(), **({"state": change_windows} if r.id == "R-CHG-1" else {})} for r in list_rules()]

    def show(rows: list[dict[str, Any]]) -> None:
        table("AGENTS.md rules", ["id", "title", "enforcement", "where"],
               [[r["id"], r["title"], r["enforcement"], r["where"]] for r in rows])
        say(f"R-CHG-1: {change_windows['summary']}")

    emit(listed, as_json, show)
