"""Skills as data: every `skills/<name>/SKILL.md` and the Python callable behind each of its
steps. A step names its implementation as `(impl: `module.function`)`, so the text a person
or an agent reads and the code that runs cannot drift apart unnoticed; the front matter's
`metadata.cli` names the skill's command (`trainops skill run NAME` runs it)."""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from skills_ref import read_properties

SKILLS_ROOT = Path(__file__).parent
MAIN_SKILL = "training-efficiency-ablation-and-fault-sop"
_STEP = re.compile(r"^(\d+)\.\s+(.*?)\s*\(impl:\s*`([\w.]+)`\)\s*$")
_NUMBERED = re.compile(r"^(\d+)\.\s+")
_COMMAND_WORD = re.compile(r"^[a-z][a-z0-9-]*$")


@dataclass(frozen=True)
class Step:
    number: int
    text: str
    impl: str | None

    def resolve(self) -> Callable:
        """Import the step's implementation; raises LookupError naming the step when it is missing."""
        if not self.impl:
            raise LookupError(f"step {self.number} ({self.text[:40]!r}) names no implementation; add (impl: "
                              "`module.fn`)")
        module, _, attr = self.impl.rpartition(".")
        fn = getattr(importlib.import_module(module), attr, None)
        if not callable(fn):
            raise LookupError(f"step {self.number}: {self.impl} is not a callable; fix the SKILL.md or add the "
                              "function")
        return fn


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    path: Path
    steps: tuple[Step, ...]
    cli: str | None = None  # the usage line in the front matter's metadata.cli, e.g. "trainops env"

    def command(self) -> tuple[str, ...]:
        """The `trainops` command path the skill runs as, from its usage line: the lower-case words
        after `trainops`, up to the first argument or option ("trainops plan checkpoint --save-s S"
        -> ("plan", "checkpoint")). LookupError when the SKILL.md declares none."""
        words = (self.cli or "").split()
        if words[:1] != ["trainops"] or len(words) < 2 or not _COMMAND_WORD.match(words[1]):
            raise LookupError(f"skill {self.name!r} declares no command line: {self.path} needs metadata.cli, a "
                              f"usage line such as \"trainops env\" (got {self.cli!r})")
        path = []
        for word in words[1:]:
            if not _COMMAND_WORD.match(word):
                break
            path.append(word)
        return tuple(path)


def skill_dirs() -> list[Path]:
    return sorted(p.parent for p in SKILLS_ROOT.glob("*/SKILL.md"))


def parse_steps(text: str) -> tuple[Step, ...]:
    """Numbered items under the `## Steps` heading."""
    steps, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line.strip().lower() == "## steps"
            continue
        if inside and _NUMBERED.match(line):
            match = _STEP.match(line)
            number = int(_NUMBERED.match(line).group(1))
            steps.append(Step(number, match.group(2) if match else line, match.group(3) if match else None))
    return tuple(steps)


def load(path: Path) -> Skill:
    props = read_properties(path)
    return Skill(name=props.name, description=props.description, path=path / "SKILL.md",
                 steps=parse_steps((path / "SKILL.md").read_text(encoding="utf-8")),
                 cli=(props.metadata or {}).get("cli"))


def all_skills() -> dict[str, Skill]:
    return {s.name: s for s in map(load, skill_dirs())}


def get(name: str) -> Skill:
    skills = all_skills()
    if name not in skills:
        raise LookupError(f"skill {name!r} not found; known skills: {', '.join(skills)} (trainops skill list)")
    return skills[name]
