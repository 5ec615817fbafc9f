"""Every `trainops ...` command the skills and the docs spell out exists, with every flag they give it
(issue 42 item 10): a SKILL.md or a doc that names a step's command or flag with no command behind
it fails here, not in front of a user."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from trainops.cli import app

ROOT = Path(__file__).parents[2]
DOCUMENTS = sorted({ROOT / "SKILL.md", *ROOT.glob("skills/*/SKILL.md"), ROOT / "README.md", *ROOT.glob("docs/*.md")})
MENTION = re.compile(r"`(trainops(?: [^`]+)?)`")


def _command(words: list[str]):
    """The deepest command `words` names, and the words left after it."""
    command = typer.main.get_command(app)
    while words and hasattr(command, "list_commands"):
        sub = command.get_command(typer.Context(command), words[0])
        if sub is None:
            break
        command, words = sub, words[1:]
    return command, words


def _flags(words: list[str]) -> list[str]:
    return [flag for word in words if (flag := word.split("=")[0].strip("[](),.")).startswith("--")]


def _mentions(path: Path) -> list[str]:
    return [" ".join(m.group(1).split()) for m in MENTION.finditer(path.read_text())]


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_and_flag_exists(path):
    missing = []
    for mention in _mentions(path):
        words = mention.split()[1:]
        command, rest = _command(words)
        if rest and not rest[0].startswith("-") and hasattr(command, "list_commands") and rest[0].islower():
            missing.append(f"{mention!r}: no command {rest[0]!r}")
        options = {"--help", *(o for p in command.params for o in (*p.opts, *p.secondary_opts))}
        missing += [f"{mention!r}: {flag} is not an option of it" for flag in _flags(rest) if flag not in options]
    assert not missing, "\n".join(missing)


def test_a_made_up_command_or_flag_is_caught():
    command, rest = _command(["sop", "--warp-speed"])
    assert command.name == "sop" and _flags(rest) == ["--warp-speed"]
    assert "--warp-speed" not in {o for p in command.params for o in p.opts}
    command, rest = _command(["tenant", "NAME"])
    assert rest == ["tenant", "NAME"] and hasattr(command, "list_commands")
