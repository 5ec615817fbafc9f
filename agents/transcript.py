"""A per-thread transcript: every message, tool call, tool result and gate decision, one
JSON line each, so a human can audit what the agent did without opening the SQLite state."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trainops.workspace import check_id, home


def transcript_path(thread_id: str) -> Path:
    folder = home() / "transcripts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{check_id('thread', thread_id)}.jsonl"


def record(thread_id: str | None, kind: str, **data: Any) -> None:
    if not thread_id:
        return
    entry = {"time": time.time(), "thread": thread_id, "kind": kind, **data}
    with open(transcript_path(thread_id), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, default=str, sort_keys=True) + "\n")


def read(thread_id: str) -> list[dict[str, Any]]:
    path = transcript_path(thread_id)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
