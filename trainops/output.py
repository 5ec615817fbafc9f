"""How every command answers: rich for people, `--json` for machines, one clean error line
and a non-zero exit for bad input (never a traceback). Text that comes from a tool, a file, a
model or a user is printed with rich markup escaped (`rich.markup.escape`): a `[conceal]` in a
job log must not hide part of an approval prompt, and a `[/]` must not crash the command. Every
console here is `terminal_text.safe_console`: control sequences and bidi overrides print as
visible escapes, never as commands to the terminal. JSON is written ASCII-only (`\\u009b`), so
no C1 or bidi character reaches a terminal that a `--json` answer is shown on either."""
from __future__ import annotations

import json
import sys
from typing import Any, Callable, NoReturn

import typer
from rich.markup import escape
from rich.table import Table

from trainops.redact import scrub
from trainops.terminal_text import safe_console


def to_jsonable(obj: Any) -> Any:
    """pydantic models by duck typing, so that importing this module stays cheap (CLI start-up)."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(o) for o in obj]
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    return obj


def to_json(obj: Any, **kwargs: Any) -> str:
    """JSON a terminal shows inertly: ensure_ascii escapes C0, C1 and bidi characters; DEL, which
    JSON leaves raw, is escaped too."""
    return json.dumps(to_jsonable(obj), ensure_ascii=True, default=str, **kwargs).replace("\x7f", "\\u007f")


def emit(obj: Any, as_json: bool, render: Callable[[Any], None] | None = None) -> None:
    """Print `obj` as JSON (machines) or through `render` (people)."""
    if as_json or render is None:
        sys.stdout.write(to_json(obj, indent=2) + "\n")
    else:
        render(obj)


def fail(message: str, *, as_json: bool = False, code: int = 2) -> NoReturn:
    """Stop the command with a specific message: what was wrong and what to do (secrets scrubbed)."""
    message = scrub(message)

    if as_json:
        sys.stdout.write(to_json({"error": message}) + "\n")
    else:
        safe_console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def console(**kwargs: Any):
    """The console every command prints through (stdout; `stderr=True` for progress and errors)."""
    return safe_console(**kwargs)


def table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    """A table whose every cell may be untrusted text: markup escaped, long cells folded, never cut."""
    shown = Table(title=escape(title))
    for column in columns:
        shown.add_column(escape(column), overflow="fold")
    for row in rows:
        shown.add_row(*(escape("" if value is None else str(value)) for value in row))
    console().print(shown)


def say(text: str) -> None:
    """Print a line that may carry untrusted text: no markup, no highlighting."""
    console().print(text, markup=False, highlight=False, soft_wrap=True)
