"""A scenario: a frozen workspace (`workspace/`), the scheduler snapshot (`workspace/scheduler.json`)
and `scenario.toml`, which says what the agent is asked, what a right answer holds and what must
never happen. `HOME_TOKEN` stands for the recorded workspace's path in every frozen text file."""
from __future__ import annotations

import json
import os
import shutil
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Literal

from pydantic import BaseModel, Field, ValidationError

HOME_TOKEN = "{TRAINOPS_HOME}"
SCENARIO_FILE = "scenario.toml"
WORKSPACE = "workspace"
SCENARIOS_DIR = Path(__file__).parent / "scenarios"
HELD_OUT_DIR = Path(__file__).parent / "held_out"
"""Requests phrased afresh over recorded workspaces, written before the offline policy ran on them. Retired:
tuned on while the understanding layer was built (issue 38), so its score is no longer a held-out
measure; ONCALL_DIR is the fresh set."""
ONCALL_DIR = Path(__file__).parent / "oncall"
"""Requests as on-call engineers write them (terse, typos, short ids, indirect questions), written by
someone who had not read agents/, frozen before the understanding layer ran on them."""


class Expected(BaseModel):
    """What a right answer holds; a field left empty is not checked."""

    verdict: Literal["diagnosed", "inconclusive", "healthy", "answered"] | None = None
    fault_kind: str | None = None
    cause_class: str | None = None
    ranks: list[int] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list,
                                description="Texts each of which some cited evidence quote must contain.")
    actions: list[str] = Field(default_factory=list, description="Tools the answer must propose.")
    approvals: list[str] = Field(default_factory=list,
                                 description="Gated tools the agent must have asked a human for (call left pending).")
    answer_contains: list[str] = Field(default_factory=list,
                                       description="For SOP questions: texts the summary must contain (numbers).")


class Never(BaseModel):
    """What must never happen; every scenario checks ungated mutations and overclaiming."""

    injected_tools: list[str] = Field(default_factory=list,
                                      description="Tools the planted text tells the agent to call.")
    injected_marker: str = Field("", description="A phrase of the planted text the answer must not repeat as advice.")
    other_tenants: list[str] = Field(default_factory=list, description="Tenants the agent must not act on.")


class Scenario(BaseModel):
    name: str
    request: str
    tags: list[str] = Field(description="A difficulty (easy, medium, hard) and kinds (crash, injection, sop, ...).")
    recorded_from: str = Field(description="The real run or drill the workspace was frozen from.")
    expected: Expected
    never: Never = Field(default_factory=Never)
    act: Literal["question", "order", "plan"] | None = Field(
        None, description="What the request is: a question must never get a mutating tool called or proposed.")
    workspace_from: str | None = Field(
        None, pattern=r"^[a-z0-9-]+$",
        description="Reuse the frozen workspace of this main-set scenario instead of a workspace/ of its own.")
    max_tool_calls: int = Field(15, ge=1)
    folder: Path | None = Field(None, exclude=True)


def load(folder: Path) -> Scenario:
    path = folder / SCENARIO_FILE
    try:
        data = tomllib.loads(path.read_text())
        return Scenario.model_validate(data).model_copy(update={"folder": folder})
    except FileNotFoundError:
        raise ValueError(f"{path}: no scenario.toml; record one with `trainops eval record`") from None
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise ValueError(f"{path}: {exc}") from None


def load_all(root: Path = SCENARIOS_DIR, only: list[str] | None = None) -> list[Scenario]:
    folders = sorted(p for p in root.iterdir() if (p / SCENARIO_FILE).is_file())
    if only:
        unknown = set(only) - {p.name for p in folders}
        if unknown:
            raise ValueError(f"--scenario: unknown {', '.join(sorted(unknown))}; see {root}")
        folders = [p for p in folders if p.name in only]
    return [load(p) for p in folders]


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def dumps(scenario: Scenario) -> str:
    """scenario.toml text: top-level keys, then [expected] and [never], empty values left out."""
    data = scenario.model_dump(exclude={"folder"})
    lines = [f"{k} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None]
    for table in ("expected", "never"):
        lines += ["", f"[{table}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in data[table].items() if v not in (None, "", [])]
    return "\n".join(lines) + "\n"


def materialize(scenario: Scenario, home: Path) -> Path:
    """Copy the frozen workspace to `home` (a fresh folder), its path written where the recording's was."""
    source = (SCENARIOS_DIR / scenario.workspace_from if scenario.workspace_from else scenario.folder) / WORKSPACE
    if not source.is_dir():
        raise ValueError(f"{scenario.name}: no recorded workspace at {source}; workspace_from names a main-set "
                         "scenario (benchmarks/agent_eval/scenarios/<name>)")
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    for path in sorted(source.rglob("*")):
        target = home / path.relative_to(source)
        if path.is_dir():
            target.mkdir(exist_ok=True, mode=0o700)
            continue
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            target.write_text(path.read_text().replace(HOME_TOKEN, str(home)))
        except UnicodeDecodeError:
            shutil.copyfile(path, target)
        target.chmod(0o600)
    return home


@contextmanager
def workspace_at(home: Path) -> Iterator[None]:
    """$TRAINOPS_HOME set to `home` for the block (a recording's or a replay's workspace), then restored."""
    before = os.environ.get("TRAINOPS_HOME")
    os.environ["TRAINOPS_HOME"] = str(home)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRAINOPS_HOME", None)
        else:
            os.environ["TRAINOPS_HOME"] = before
