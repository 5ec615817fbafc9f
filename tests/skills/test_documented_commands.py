"""Every `trainops ...` command the skills and the docs spell out exists, with every flag they give it
(issue 42 item 10): a SKILL.md or a doc that names a step's command or flag with no command behind
it fails here, not in front of a user."""
from __future__ import annotations

import json
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


def _outputs(skill: Path) -> list[tuple[str, list[str]]]:
    """(output, the fields or files its `in the pack` cell lists, comma-separated) per row of a skill's Outputs
    table."""
    section = skill.read_text().split("## Outputs", 1)[1].split("\n## ", 1)[0]
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in section.splitlines() if line.startswith("| ")]
    column = rows[0].index("in the pack")
    return [(row[0], [name.strip() for name in row[column].split(",") if name.strip()]) for row in rows[1:]]


SCHEMA = ROOT / "skills/evidence/evidence.schema.json"


def test_every_output_the_sop_skill_promises_is_a_field_or_file_of_the_pack():
    fields = set(json.loads(SCHEMA.read_text())["properties"])
    promised = _outputs(ROOT / "SKILL.md")
    assert len(promised) >= 6 and all(names for _, names in promised), promised
    unknown = [name for _, names in promised for name in names if name not in fields and "." not in name]
    assert not unknown, f"SKILL.md promises pack fields the pack does not have: {unknown}"


def test_the_quick_sop_pack_holds_every_promised_output(quick_sop):
    pack_dir = Path(quick_sop["pack_dir"])
    pack = json.loads((pack_dir / "evidence.json").read_text())
    for output, names in _outputs(ROOT / "SKILL.md"):
        for name in names:
            if "." in name:
                assert (pack_dir / name).is_file(), (output, name)
            elif name != "blockers":  # a passing pack has none
                assert pack.get(name) not in (None, [], {}, ""), (output, name, pack.get(name))
