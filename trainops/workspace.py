"""Where trainops keeps its state: `$TRAINOPS_HOME` (default `./.trainops`).

Every folder is created on first use, so a fresh checkout needs no set-up step.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def home() -> Path:
    path = Path(os.environ.get("TRAINOPS_HOME", ".trainops")).expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sub(name: str) -> Path:
    path = home() / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def runs_dir() -> Path:
    return _sub("runs")


def packs_dir() -> Path:
    return _sub("packs")


def jobs_dir() -> Path:
    return _sub("jobs")


def keys_dir() -> Path:
    return _sub("keys")


def audit_log_path() -> Path:
    return home() / "audit.jsonl"


def agent_db_path() -> Path:
    return home() / "agent.sqlite"


def check_id(kind: str, value: str) -> str:
    """Ids become folder names: refuse anything that could escape the workspace."""
    if not _SAFE_ID.match(value):
        raise ValueError(
            f"{kind} id {value!r} is not valid: use letters, digits, '_', '.', '-' "
            "(at most 128 characters, not starting with a dot)"
        )
    return value
