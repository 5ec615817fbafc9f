"""Append-only, tamper-evident audit log (rule R-SEC-5).

Each line is one JSON entry carrying `seq`, `prev_hash` and `hash`, where `hash` is the
sha256 of the canonical JSON of the entry without `hash`. Editing, deleting, inserting or
reordering a line breaks the chain at that line; a sidecar head file (`audit.jsonl.head`)
records the last `seq`/`hash`, so cutting lines off the end is caught too. Writers from
several processes serialise on an `fcntl.flock` held around read-last-hash + append.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel, Field

GENESIS_HASH = "0" * 64


def canonical_json(obj: Any) -> str:
    """The one serialisation that hashes and signatures are computed over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sha256_hex(text: str | bytes) -> str:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


def entry_hash(entry: dict[str, Any]) -> str:
    return sha256_hex(canonical_json({k: v for k, v in entry.items() if k != "hash"}))


def _log_path(path: Path | None) -> Path:
    if path is not None:
        return Path(path)
    from trainops.workspace import audit_log_path

    return audit_log_path()


def _head_path(log: Path) -> Path:
    return log.with_name(log.name + ".head")


@contextmanager
def _locked(log: Path) -> Iterator[None]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log.with_name(log.name + ".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _last_line(log: Path) -> str | None:
    """The last non-empty line, read backwards from the end so appends stay O(1)."""
    if not log.exists() or log.stat().st_size == 0:
        return None
    with open(log, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        pos = fh.tell()
        chunk = b""
        while pos > 0:
            step = min(4096, pos)
            pos -= step
            fh.seek(pos)
            chunk = fh.read(step) + chunk
            lines = chunk.rstrip(b"\n").split(b"\n")
            if len(lines) > 1 or pos == 0:
                return lines[-1].decode("utf-8")
    return None


def append(kind: str, path: Path | None = None, durable: bool = True, **fields: Any) -> dict[str, Any]:
    """Append one entry of `kind` (tool_call, gate, approval, ...) and return it with its hash.
    `durable` fsyncs the line (about 10 ms here); read-only tool calls skip it."""
    log = _log_path(path)
    with _locked(log):
        last = _last_line(log)
        if last is None:
            seq, prev = 1, GENESIS_HASH
        else:
            prev_entry = json.loads(last)
            seq, prev = prev_entry["seq"] + 1, prev_entry["hash"]
        entry = {"seq": seq, "time": time.time(), "kind": kind, **fields, "prev_hash": prev}
        entry["hash"] = entry_hash(entry)
        line = canonical_json(entry) + "\n"
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        _head_path(log).write_text(canonical_json({"seq": seq, "hash": entry["hash"]}) + "\n")
    return entry


class AuditReport(BaseModel):
    """What `trainops audit verify` answers."""

    ok: bool
    path: str
    entries: int = Field(description="Lines read from the log.")
    first_bad_line: int | None = Field(None, description="1-based line number of the first broken entry.")
    reason: str = ""


def verify(path: Path | None = None) -> AuditReport:
    """Walk the chain; name the first line whose hash, link or sequence number is wrong."""
    log = _log_path(path)
    if not log.exists():
        return AuditReport(ok=True, path=str(log), entries=0, reason="no audit log yet")
    prev, expected_seq, n = GENESIS_HASH, 1, 0
    with open(log, encoding="utf-8") as fh:
        for n, raw in enumerate(fh, start=1):
            bad = _check_line(raw, prev, expected_seq)
            if bad:
                return AuditReport(ok=False, path=str(log), entries=n, first_bad_line=n, reason=bad)
            entry = json.loads(raw)
            prev, expected_seq = entry["hash"], expected_seq + 1
    head_file = _head_path(log)
    if head_file.exists():
        head = json.loads(head_file.read_text())
        last_seq = expected_seq - 1
        if head["seq"] > last_seq or (head["seq"] == last_seq and head["hash"] != prev):
            return AuditReport(
                ok=False, path=str(log), entries=n, first_bad_line=min(head["seq"], n + 1),
                reason=f"log ends at entry {last_seq} but the head file records entry {head['seq']} "
                       f"({head['hash'][:12]}): lines were removed from or replaced at the end",
            )
    return AuditReport(ok=True, path=str(log), entries=n, reason="chain intact")


def _check_line(raw: str, prev: str, expected_seq: int) -> str:
    try:
        entry = json.loads(raw)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg})"
    if not isinstance(entry, dict) or "hash" not in entry or "prev_hash" not in entry:
        return "entry lacks hash/prev_hash"
    if entry["hash"] != entry_hash(entry):
        return "hash does not match the entry's content: the entry was edited"
    if entry["prev_hash"] != prev:
        return "prev_hash does not link to the previous line: an entry was deleted, inserted or moved"
    if entry.get("seq") != expected_seq:
        return f"seq is {entry.get('seq')}, expected {expected_seq}: entries are out of order"
    return ""


def read(path: Path | None = None, tail: int | None = None) -> list[dict[str, Any]]:
    log = _log_path(path)
    if not log.exists():
        return []
    with open(log, encoding="utf-8") as fh:
        entries = [json.loads(line) for line in fh if line.strip()]
    return entries[-tail:] if tail else entries
