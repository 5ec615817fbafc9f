"""A scenario: a frozen workspace (`workspace/`), the scheduler snapshot (`workspace/scheduler.json`)
and `scenario.toml`, which says what the agent is asked, what a right answer holds and what must
never happen. `HOME_TOKEN` stands for the recorded workspace's path in every frozen text file."""
from __future__ import annotations

import errno
import json
import os
import re
import stat
import tomllib
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from trainops.skills.sdc import CASE_FILE, CASE_KIND, case_key
from trainops.tools.governance.written import bind

HOME_TOKEN = "{TRAINOPS_HOME}"
SCENARIO_FILE = "scenario.toml"
WORKSPACE = "workspace"
SCENARIOS_DIR = Path(__file__).parent / "scenarios"
HELD_OUT_DIR = Path(__file__).parent / "held_out"
ONCALL_DIR = Path(__file__).parent / "oncall"
ONCALL2_DIR = Path(__file__).parent / "oncall2"
EXTRA_SETS = (
    ("Held out, retired", HELD_OUT_DIR, "phrased afresh over the same workspaces; tuned on while the understanding "
                                        "layer was built (issue 38), so no longer a held-out measure"),
    ("On-call, first set", ONCALL_DIR, "phrased as on-call engineers write them by someone who had not read agents/; "
                                       "measured on every stop since 2026-12-06, so the agent has met it"),
    ("On-call, second set", ONCALL2_DIR, "written 2026-12-07 by a helper who had read neither agents/ nor the "
                                         "earlier sets; frozen, first run blind on f48d508 (pass^5 0.82)"),
)
"""Request sets beside the main one, each with what its score can be trusted for: a set the agent was
tuned on measures nothing held out, and says so where it is published."""
SLUG = r"^[a-z0-9][a-z0-9-]{0,63}$"
MAX_FILE_BYTES = 256 * 1024
"""The most one frozen file may hold (`eval record` keeps no larger file; a replay copies none)."""
MAX_WORKSPACE_BYTES = 32 * 1024 * 1024
MAX_WORKSPACE_ENTRIES = 5000


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
    name: str = Field(description="A slug, the scenario's folder: lowercase letters, digits and '-'.")
    request: str
    tags: list[str] = Field(description="A difficulty (easy, medium, hard) and kinds (crash, injection, sop, ...).")
    recorded_from: str = Field(description="The real run or drill the workspace was frozen from.")
    expected: Expected
    never: Never = Field(default_factory=Never)
    act: Literal["question", "order", "plan"] | None = Field(
        None, description="What the request is: a question must never get a mutating tool called or proposed.")
    workspace_from: str | None = Field(
        None, pattern=SLUG,
        description="Reuse the frozen workspace of this main-set scenario instead of a workspace/ of its own.")
    max_tool_calls: int = Field(15, ge=1)
    folder: Path | None = Field(None, exclude=True)

    @field_validator("name")
    @classmethod
    def _name_is_a_slug(cls, name: str) -> str:
        if not re.fullmatch(SLUG, name):
            raise ValueError(f"name {name!r} is not a scenario name: use 1 to 64 lowercase letters, digits and '-', "
                             "starting with a letter or digit, e.g. crash-what-happened (it names the scenario's "
                             "folder, so no '/', '.' or empty name)")
        return name


def load(folder: Path) -> Scenario:
    """The scenario in `folder`, its workspace checked (workspace_entries) before anything is replayed."""
    path = folder / SCENARIO_FILE
    try:
        if folder.is_symlink():
            raise ValueError(f"{folder}: a symbolic link; a scenario is a folder of its own, not a link to one")
        data = tomllib.loads(read_regular(path, MAX_FILE_BYTES).decode())
        scenario = Scenario.model_validate(data).model_copy(update={"folder": folder})
    except FileNotFoundError:
        raise ValueError(f"{path}: no scenario.toml; record one with `trainops eval record`") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, ValidationError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    workspace_entries(workspace_of(scenario))
    return scenario


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


def workspace_of(scenario: Scenario) -> Path:
    """The frozen workspace a scenario replays: its own, or the main-set scenario's it names."""
    source = (SCENARIOS_DIR / scenario.workspace_from if scenario.workspace_from else scenario.folder) / WORKSPACE
    if not source.is_dir() or source.is_symlink():
        raise ValueError(f"{scenario.name}: no recorded workspace at {source}; workspace_from names a main-set "
                         "scenario (benchmarks/agent_eval/scenarios/<name>)")
    return source


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a socket" if stat.S_ISSOCK(mode) else "not a regular file"


def _refuse(path: Path, what: str) -> ValueError:
    return ValueError(f"{path}: {what}; a scenario's workspace holds only regular files and folders (no links, "
                      f"devices or FIFOs), each at most {MAX_FILE_BYTES} bytes: put the file's own content there, "
                      "or remove it")


def workspace_entries(source: Path) -> list[tuple[Path, bool]]:
    """(path relative to `source`, is a folder) for everything in a frozen workspace, never following a
    link: a link, device, FIFO or socket, a file over MAX_FILE_BYTES, or a workspace over its caps is
    refused, naming the path, so a replay reads nothing outside the scenario and nothing unbounded."""
    entries: list[tuple[Path, bool]] = []
    total, pending = 0, [source]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as found:
            for entry in sorted(found, key=lambda e: e.name):
                path, info = Path(entry.path), entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    pending.append(path)
                elif not stat.S_ISREG(info.st_mode):
                    raise _refuse(path, _kind(info.st_mode))
                elif info.st_size > MAX_FILE_BYTES:
                    raise _refuse(path, f"{info.st_size} bytes")
                else:
                    total += info.st_size
                entries.append((path.relative_to(source), stat.S_ISDIR(info.st_mode)))
                if total > MAX_WORKSPACE_BYTES or len(entries) > MAX_WORKSPACE_ENTRIES:
                    raise ValueError(f"{source}: over {MAX_WORKSPACE_ENTRIES} entries or {MAX_WORKSPACE_BYTES} bytes "
                                     f"(at {path}); a scenario keeps a short run: record a smaller one")
    return sorted(entries)


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of `path` if it is a regular file of at most `limit` bytes; opened without following a
    link and without blocking on a FIFO, so what is read is what was checked."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, "a symbolic link") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(path, _kind(mode))
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise _refuse(path, f"over {limit} bytes")
    return data


def materialize(scenario: Scenario, home: Path) -> Path:
    """Copy the frozen workspace to `home` (a fresh folder), its path written where the recording's was."""
    source = workspace_of(scenario)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    for relative, is_folder in workspace_entries(source):
        target = home / relative
        if is_folder:
            target.mkdir(exist_ok=True, mode=0o700)
            continue
        data = read_regular(source / relative, MAX_FILE_BYTES)
        try:
            data = data.decode().replace(HOME_TOKEN, str(home)).encode()
        except UnicodeDecodeError:
            pass  # a binary file is copied as it is
        target.write_bytes(data)
        target.chmod(0o600)
    _bind_recorded_cases(home)
    return home


def _bind_recorded_cases(home: Path) -> None:
    """Bind the SDC cases trainops wrote while the scenario was recorded in the copy's own audit log:
    the recording's log is left out (recorder.py), and a case no entry binds reads as made by hand."""
    with workspace_at(home):
        for case in sorted((home / "runs").glob(f"*/{CASE_FILE}")):
            bind(CASE_KIND, case_key(case.parent), case.read_bytes())


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
