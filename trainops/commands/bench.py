"""CLI commands for this area (being built)."""
from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    return None
