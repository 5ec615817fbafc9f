"""Checkpoints on disk, read without torch.distributed: the committed layout (`step-N/` with a
`COMMIT.json` of file sizes and sha256, never an unfinished `step-N.tmp/`), listing and
verification. The DCP checkpointer (trainer/checkpoint.py) writes this layout; the tools,
drills and other frameworks' adapters read it through these functions and models.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

COMMIT_FILE = "COMMIT.json"
_STEP_DIR = re.compile(r"^step-(\d{8})(\.tmp)?$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


class CheckpointInfo(BaseModel):
    step: int = Field(description="Training step the checkpoint was taken after.")
    path: str = Field(description="Folder of the checkpoint.")
    committed: bool = Field(description="True when the write finished and COMMIT.json was written.")
    size_bytes: int = Field(description="Total size of the files in the folder.")
    time: float = Field(description="Commit wall time (unix s); folder mtime when not committed.")


class CheckpointVerification(BaseModel):
    path: str = Field(description="Folder that was verified.")
    step: int | None = Field(default=None, description="Step recorded in COMMIT.json, if readable.")
    committed: bool = Field(description="COMMIT.json is present and readable.")
    complete: bool = Field(description="Committed, every listed file present with its size and sha256.")
    missing_files: list[str] = Field(default_factory=list, description="Listed in COMMIT.json, absent.")
    checksum_mismatches: list[str] = Field(
        default_factory=list, description="Present, but size or sha256 differs from COMMIT.json."
    )
    message: str = Field(description="One line: what was checked and what failed.")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != COMMIT_FILE)


def corruption_message(folder: Path, missing: list[str], mismatched: list[str], any_listed: bool = True) -> str | None:
    """What is wrong with a committed checkpoint, in one line; None when nothing is. The full
    verification and a replica group's reader both speak these words."""
    problems = []
    if missing:
        problems.append(f"missing files {missing}")
    if mismatched:
        problems.append(f"checksum mismatch in {mismatched}")
    if not any_listed:
        problems.append(f"{COMMIT_FILE} lists no files")
    return f"checkpoint {folder.name} is corrupt: " + "; ".join(problems) if problems else None


def list_checkpoints(folder: str | Path) -> list[CheckpointInfo]:
    """Every `step-N/` and unfinished `step-N.tmp/` under `folder`, oldest step first."""
    root = Path(folder)
    infos: list[CheckpointInfo] = []
    if not root.is_dir():
        return infos
    for entry in root.iterdir():
        match = _STEP_DIR.match(entry.name)
        if not match or not entry.is_dir():
            continue
        commit = entry / COMMIT_FILE
        committed = match.group(2) is None and commit.is_file()
        commit_time = entry.stat().st_mtime
        if committed:
            try:
                commit_time = float(json.loads(commit.read_text())["time"])
            except (ValueError, KeyError, TypeError):
                committed = False
        infos.append(
            CheckpointInfo(
                step=int(match.group(1)),
                path=str(entry),
                committed=committed,
                size_bytes=sum(p.stat().st_size for p in entry.rglob("*") if p.is_file()),
                time=commit_time,
            )
        )
    return sorted(infos, key=lambda info: (info.step, info.committed))


def verify_checkpoint(path: str | Path) -> CheckpointVerification:
    """Check a checkpoint folder against its COMMIT.json: presence, size and sha256 of each file."""
    folder = Path(path)
    if not folder.is_dir():
        return CheckpointVerification(
            path=str(folder), committed=False, complete=False,
            message=f"checkpoint {folder} does not exist",
        )
    commit_path = folder / COMMIT_FILE
    if not commit_path.is_file():
        return CheckpointVerification(
            path=str(folder), committed=False, complete=False,
            message=f"checkpoint {folder} has no {COMMIT_FILE}: the write did not finish (partial)",
        )
    try:
        commit = json.loads(commit_path.read_text())
        listed: dict[str, dict[str, Any]] = commit["files"]
        step = int(commit["step"])
    except (ValueError, KeyError, TypeError) as err:
        return CheckpointVerification(
            path=str(folder), committed=False, complete=False,
            message=f"checkpoint {folder}: {COMMIT_FILE} is unreadable ({err}); treat as corrupt",
        )
    missing, mismatched = [], []
    for name, expected in sorted(listed.items()):
        file = folder / name
        if not file.is_file():
            missing.append(name)
        elif file.stat().st_size != expected["size_bytes"] or file_sha256(file) != expected["sha256"]:
            mismatched.append(name)
    complete = not missing and not mismatched and bool(listed)
    message = (corruption_message(folder, missing, mismatched, bool(listed))
               or f"checkpoint {folder.name}: {len(listed)} files verified (size and sha256)")
    return CheckpointVerification(
        path=str(folder), step=step, committed=True, complete=complete,
        missing_files=missing, checksum_mismatches=mismatched, message=message,
    )
