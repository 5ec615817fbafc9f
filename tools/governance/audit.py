"""Append-only, tamper-evident audit log (rule R-SEC-5).

Each line is one JSON entry carrying `seq`, `prev_hash` and `hash`, where `hash` is the
sha256 of the canonical JSON of the entry without `hash`. Editing, deleting, inserting or
reordering a line breaks the chain at that line; a sidecar head file (`audit.jsonl.head`)
records the last `seq`/`hash`, so cutting lines off the end is caught too. Writers from
several processes serialise on an `fcntl.flock` held around read-last-hash + append.

Fail-closed: a mutating call writes its `intent` (durably) before it acts and its `outcome`
after; when the intent cannot be written the gate refuses the call. A torn last line (a write
cut short) stops every append with an AuditUnavailable naming the line, until a person runs
`trainops audit repair`, which moves the torn bytes to a side file and audits the repair.
What the chain and head do not stop: a writer who can rewrite both files can recompute the
whole chain; only signed anchors and a log owned by another OS user defend against that.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any, Iterator

from pydantic import BaseModel, Field

from trainops.workspace import audit_log_path

GENESIS_HASH = "0" * 64


class AuditUnavailable(RuntimeError):
    """The audit log cannot take an entry (torn last line, unwritable file): names the file and the fix."""
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


def _last_line(log: Path) -> tuple[int, bytes] | None:
    """The byte offset and raw bytes of the last line, read backwards from the end so appends
    stay O(1). A line cut short keeps its missing newline, so the caller can tell it is torn."""
    if not log.exists() or log.stat().st_size == 0:
        return None
    with open(log, "rb") as fh:
        end = fh.seek(0, os.SEEK_END)
        pos, chunk = end, b""
        while pos > 0:
            step = min(4096, pos)
            pos -= step
            fh.seek(pos)
            chunk = fh.read(step) + chunk
            cut = chunk.rfind(b"\n", 0, len(chunk) - 1)
            if cut >= 0:
                return pos + cut + 1, chunk[cut + 1:]
    return 0, chunk


def _line_count(log: Path) -> int:
    with open(log, "rb") as fh:
        return sum(1 for _ in fh)


def _torn_problem(raw: bytes) -> str | None:
    """Why the last line is torn (a write cut short), or None when it is a complete entry."""
    if not raw.endswith(b"\n"):
        return f"{len(raw)} byte(s) without a closing newline"
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "not valid JSON"
    if not isinstance(entry, dict) or not isinstance(entry.get("seq"), int) or "hash" not in entry:
        return "not an audit entry (no seq/hash)"
    return None


def _tail_entry(log: Path) -> dict[str, Any] | None:
    """The last entry; a torn last line is an AuditUnavailable naming the line and the repair."""
    last = _last_line(log)
    if last is None:
        return None
    problem = _torn_problem(last[1])
    if problem:
        raise AuditUnavailable(f"audit log {log} line {_line_count(log)} is torn ({problem}); nothing can be "
                               "appended after it, so audited calls are refused: run `trainops audit repair` "
                               "(it keeps the torn bytes in a side file and records the repair)")
    return json.loads(last[1])


def append(kind: str, path: Path | None = None, durable: bool = True, **fields: Any) -> dict[str, Any]:
    """Append one entry of `kind` (tool_call, gate, approval, ...) and return it with its hash.
    `durable` fsyncs the line (about 10 ms here); read-only tool calls skip it. Raises
    AuditUnavailable when the entry cannot be written."""
    log = _log_path(path)
    try:
        with _locked(log):
            prev_entry = _tail_entry(log)
            seq, prev = (1, GENESIS_HASH) if prev_entry is None else (prev_entry["seq"] + 1, prev_entry["hash"])
            entry = {"seq": seq, "time": time.time(), "kind": kind, **fields, "prev_hash": prev}
            entry["hash"] = entry_hash(entry)
            _write_line(log, canonical_json(entry) + "\n", durable)
            _write_head(log, seq, entry["hash"])
    except OSError as exc:
        raise AuditUnavailable(f"audit log {log} cannot be written ({exc.strerror or exc}); fix its folder's "
                               "permissions or free disk space; audited calls are refused until then") from None
    return entry


def check_appendable(path: Path | None = None) -> None:
    """Raise AuditUnavailable now, before anything acts, when the next entry could not be appended."""
    log = _log_path(path)
    if log.exists() and not log.is_file():
        raise AuditUnavailable(f"audit log {log} is not a regular file; move it aside so the log can be written")
    _tail_entry(log)


def _write_line(log: Path, line: str, durable: bool) -> None:
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        if durable:
            os.fsync(fh.fileno())


def _write_head(log: Path, seq: int, entry_hash_hex: str) -> None:
    """Replace the head file atomically, so a crash never leaves half a head behind."""
    head = _head_path(log)
    tmp = head.with_name(f".{head.name}.{os.getpid()}")
    tmp.write_text(canonical_json({"seq": seq, "hash": entry_hash_hex}) + "\n")
    tmp.replace(head)


def intent(tool: str, risk: str, actor: str, input_sha256: str, path: Path | None = None, **fields: Any) -> str:
    """Record, durably, that a call is about to act; returns the id its outcome refers to.
    Raises AuditUnavailable, and the gate then refuses the call: no action goes unaudited."""
    entry = append("intent", path, durable=True, tool=tool, risk=risk, actor=actor, input_sha256=input_sha256,
                   **fields)
    return entry["hash"]


def outcome(intent_id: str, path: Path | None = None, **fields: Any) -> dict[str, Any]:
    """Record how the call announced by `intent_id` ended (ok, error, elapsed)."""
    return append("tool_call", path, durable=True, intent=intent_id, **fields)


def repair(path: Path | None = None) -> dict[str, Any]:
    """Cut a torn last line off the log, keep its bytes in `audit.jsonl.torn-<time>`, and append an
    `audit_repair` entry naming the line and the bytes' sha256. Only the last line can be torn;
    anything broken earlier is tampering, which `verify` reports and nothing repairs."""
    log = _log_path(path)
    with _locked(log):
        last = _last_line(log)
        problem = None if last is None else _torn_problem(last[1])
        if problem is None:
            raise ValueError(f"audit log {log} has no torn last line: nothing to repair "
                             "(`trainops audit verify` names any other broken line)")
        offset, torn = last
        line_no = _line_count(log)
        side = log.with_name(f"{log.name}.torn-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        side.write_bytes(torn)
        with open(log, "r+b") as fh:
            fh.truncate(offset)
            os.fsync(fh.fileno())
    return append("audit_repair", path, torn_line=line_no, torn_problem=problem, torn_bytes=len(torn),
                  torn_sha256=sha256_hex(torn), side_file=side.name)


class AuditReport(BaseModel):
    """What `trainops audit verify` answers."""
    ok: bool
    path: str
    entries: int = Field(description="Lines read from the log.")
    first_bad_line: int | None = Field(None, description="1-based line number of the first broken entry.")
    reason: str = ""


def verify_chain(path: Path | None = None) -> AuditReport:
    """Walk the chain; name the first line whose hash, link or sequence number is wrong. A missing
    log or head file fails: nothing then shows that history was not deleted or cut short. The
    signed anchors and pack decisions are checked above this module
    (`trainops.tools.governance.verification.verify`), which read the entries once the chain holds."""
    log = _log_path(path)
    if not log.exists():
        return AuditReport(ok=False, path=str(log), entries=0,
                           reason="no audit log: it was deleted, or nothing was ever audited here")
    prev, expected_seq, n, hashes = GENESIS_HASH, 1, 0, []
    with open(log, "rb") as fh:
        lines = list(fh)
    for n, raw in enumerate(lines, start=1):
        torn = _torn_problem(raw) if n == len(lines) else None
        if torn:
            return AuditReport(ok=False, path=str(log), entries=n, first_bad_line=n,
                               reason=f"the last line is torn ({torn}); run `trainops audit repair`")
        bad = _check_line(raw.decode("utf-8", errors="replace"), prev, expected_seq)
        if bad:
            return AuditReport(ok=False, path=str(log), entries=n, first_bad_line=n, reason=bad)
        entry = json.loads(raw)
        prev, expected_seq = entry["hash"], expected_seq + 1
        hashes.append(prev)
    head_file = _head_path(log)
    if not head_file.exists():
        return AuditReport(ok=False, path=str(log), entries=n, first_bad_line=None,
                           reason=f"head file {head_file.name} is missing: lines cut off the end would go unnoticed")
    try:
        head = json.loads(head_file.read_text())
        head_seq, head_hash = int(head["seq"]), str(head["hash"])
    except (ValueError, KeyError, TypeError):
        return AuditReport(ok=False, path=str(log), entries=n, reason=f"head file {head_file.name} is not a valid head")
    last_seq = expected_seq - 1
    # the head may lag one crash behind the log (line written, head not yet), no more
    if head_seq < last_seq - 1:
        return AuditReport(ok=False, path=str(log), entries=n, first_bad_line=head_seq + 2,
                           reason=f"the head file records entry {head_seq} but the log runs to {last_seq}: entries "
                                  "after it were appended by something that bypassed trainops")
    if head_seq > last_seq or head_seq < 1 or hashes[head_seq - 1] != head_hash:
        return AuditReport(
            ok=False, path=str(log), entries=n, first_bad_line=min(head_seq, n + 1),
            reason=f"log ends at entry {last_seq} but the head file records entry {head_seq} "
                   f"({head_hash[:12]}): lines were removed from or replaced at the end",
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


def read(path: Path | None = None, tail: int | None = None, first: int | None = None) -> list[dict[str, Any]]:
    """The entries as written (only the `first` lines, when given: what a verification walked, not a
    line being appended since); a line that is not JSON is an AuditUnavailable naming it."""
    log = _log_path(path)
    if not log.exists():
        return []
    entries = []
    with open(log, "rb") as fh:
        for n, line in enumerate(islice(fh, first), start=1):
            try:
                entries.append(json.loads(line))
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise AuditUnavailable(f"audit log {log} line {n} is not a JSON entry; `trainops audit verify` "
                                       "says whether it is torn (then `trainops audit repair`) or tampered") from None
    return entries[-tail:] if tail else entries
