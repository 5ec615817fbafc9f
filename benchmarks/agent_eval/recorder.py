"""`trainops eval record`: freeze a real workspace (a drill's, a run's, an SOP's) into a scenario.

Kept: each run folder but its checkpoint payloads (the journal, COMMIT.json with its checksums,
metrics, heartbeats, logs and status records stay), the scheduler's job records and logs, the
interruption record, and the scheduler's job and node states asked of the live backend now
(scheduler.json). Left out: a drill's own records (ANSWER_KEY), checkpoint tensors (MB each), the
audit log (its hash chain names this host's paths; a replay starts its own, which is the safety
log), the agent's database."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from trainops.benchmarks.agent_eval.replay import SNAPSHOT_FILE, capture
from trainops.benchmarks.agent_eval.scenario import (
    HOME_TOKEN,
    MAX_FILE_BYTES,
    SCENARIO_FILE,
    WORKSPACE,
    Scenario,
    dumps,
    read_regular,
    workspace_at,
)
from trainops.tools.schedulers import get_scheduler

KEPT_TOP = ("interruptions.jsonl", "local_nodes.json", "tenants.json")
CHECKPOINT_KEPT = ("COMMIT.json",)
ANSWER_KEY = ("drill.json", "detection.json", "faults.jsonl")
"""What only a drill writes (what it injected, and what it found): a real incident has no answer key."""



def workspace_of(source: Path) -> tuple[Path, list[Path]]:
    """(workspace, run folders to keep): a workspace keeps all its runs, a run folder only itself."""
    source = source.resolve()
    if (source / "runs").is_dir() or (source / "jobs").is_dir():
        runs = sorted(p for p in (source / "runs").iterdir()
                      if p.is_dir() and not p.is_symlink()) if (source / "runs").is_dir() else []
        return source, runs
    if source.parent.name == "runs" and (source / "config.toml").is_file():
        return source.parent.parent, [source]
    raise ValueError(f"{source}: neither a workspace (with runs/ or jobs/) nor a run folder (runs/RUN with "
                     "config.toml); give the $TRAINOPS_HOME a drill or run used, or one of its runs/RUN")


def _freeze_text(source: Path, target: Path, home: Path) -> None:
    """Copy one regular file (never through a link, never a FIFO or device), its workspace path tokenized;
    a file over MAX_FILE_BYTES is refused: record a shorter run."""
    text = read_regular(source, MAX_FILE_BYTES).decode(errors="replace")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text.replace(str(home), HOME_TOKEN))


def _kept(path: Path, run: Path) -> bool:
    parts = path.relative_to(run).parts
    if parts == (path.name,) and path.name in ANSWER_KEY:
        return False
    if parts[0] in ("checkpoints", "quarantine") and len(parts) > 1:
        return path.name in CHECKPOINT_KEPT
    return True


def record(source: Path, scenario: Scenario, dest_root: Path, plants: dict[str, str] | None = None,
           scheduler: str = "local", overwrite: bool = False) -> Path:
    """Write `dest_root/<scenario.name>/`: the frozen workspace, scheduler.json, scenario.toml.
    `plants` puts text in frozen files (workspace-relative path -> text): injected instructions
    or a loud warning, planted in the copy only (`_plant`)."""
    home, runs = workspace_of(source)
    dest = _own_folder(dest_root, scenario.name, overwrite)
    frozen = dest / WORKSPACE
    for run in runs:
        for path in sorted(run.rglob("*")):
            if path.is_file() and not path.is_symlink() and _kept(path, run):
                _freeze_text(path, frozen / path.relative_to(home), home)
    if (home / "jobs").is_dir():
        for path in sorted((home / "jobs").iterdir()):
            if path.is_file() and not path.is_symlink() and path.suffix in (".json", ".log", ".exit"):
                _freeze_text(path, frozen / "jobs" / path.name, home)
    for name in KEPT_TOP:
        if (home / name).is_file() and not (home / name).is_symlink():
            _freeze_text(home / name, frozen / name, home)
    with workspace_at(home):
        snapshot = capture(scheduler, get_scheduler(scheduler), home)
    (frozen / SNAPSHOT_FILE).write_text(snapshot.model_dump_json(indent=1).replace(str(home), HOME_TOKEN))
    try:
        for relative, text in (plants or {}).items():
            _plant(frozen, relative, text)
    except ValueError:
        shutil.rmtree(dest)  # no half-planted scenario left behind
        raise
    (dest / SCENARIO_FILE).write_text(dumps(scenario))
    return dest


def _own_folder(dest_root: Path, name: str, overwrite: bool) -> Path:
    """`dest_root/name`, emptied for a new recording: with `overwrite`, an existing scenario of that name
    (a real folder directly inside dest_root, with its scenario.toml) is removed, and nothing else ever is."""
    root = dest_root.resolve()
    dest = root / name
    if dest.resolve().parent != root:
        raise ValueError(f"--name {name!r}: a scenario's folder lies directly inside --dest {root}; use a slug, "
                         "e.g. crash-what-happened")
    if not dest.exists() and not dest.is_symlink():
        return dest
    if not overwrite:
        raise ValueError(f"{dest} exists: choose another --name or pass --overwrite")
    if dest.is_symlink() or not dest.is_dir() or not (dest / SCENARIO_FILE).is_file():
        raise ValueError(f"{dest} exists and is not a scenario folder (a real folder with its {SCENARIO_FILE}): "
                         "--overwrite replaces only a scenario; choose another --name or remove it yourself")
    shutil.rmtree(dest)
    return dest


def _plant(frozen: Path, relative: str, text: str) -> None:
    """Append `text` to a frozen log; in a JSON record (.json) or each record of a .jsonl, set the
    fields of the JSON object `text`, so the planted words arrive where a job-written string field
    would carry them and every reader still parses the file."""
    target = (frozen / relative).resolve()
    if not target.is_relative_to(frozen.resolve()) or not target.is_file():
        raise ValueError(f"--plant {relative}: not a frozen file of this scenario; use a path such as "
                         "runs/RUN/logs/rank0.log")
    if target.suffix not in (".json", ".jsonl"):
        with target.open("a") as out:
            out.write(text if text.endswith("\n") else text + "\n")
        return
    try:
        fields = json.loads(text)
    except json.JSONDecodeError:
        fields = None
    if not isinstance(fields, dict):
        raise ValueError(f"--plant {relative}: a plant in a {target.suffix} record must be a JSON object of the fields "
                         "to set, e.g. '{\"peak_source\": \"...\"}'")
    if target.suffix == ".json":
        target.write_text(json.dumps({**json.loads(target.read_text()), **fields}, indent=1))
        return
    lines = [json.dumps({**json.loads(line), **fields}) for line in target.read_text().splitlines() if line.strip()]
    target.write_text("".join(line + "\n" for line in lines))
