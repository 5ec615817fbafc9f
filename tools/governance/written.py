"""Records trainops writes and reads back later (an SOP session), bound to the audit chain.

Each time trainops writes such a record it appends an entry of the record's kind naming it and the
sha256 of the bytes written; a reader takes the record only when its bytes hash to the newest such
entry. As with a pack's `pack_written` entry this is a tripwire, not proof: anything that can
append to the log can append an entry; what it stops is a record edited or dropped in by hand (a
step result a model or a script typed) being read as trainops' own.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from trainops.tools.governance import audit


def bind(kind: str, name: str, data: bytes, **fields) -> dict:
    """Audit that trainops wrote `data` as record `name` of `kind`; returns the entry."""
    return audit.append(kind, record=name, content_hash=audit.sha256_hex(data), **fields)


def write_bound(path: Path, kind: str, name: str, data: bytes, **fields) -> Path:
    """Write `data` to `path` atomically (a reader never sees half a file), then bind it: a crash
    between the two leaves a record that reads as not trainops', never one bound to other bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    bind(kind, name, data, **fields)
    return path


def newest_written(kind: str) -> dict[str, dict]:
    """The newest audit entry of each record of `kind`, by name: one read of the log for any number of records."""
    return {e.get("record"): e for e in audit.read() if e.get("kind") == kind}


def unbound(kind: str, name: str, data: bytes, newest: dict[str, dict] | None = None) -> str | None:
    """Why `data` is not the record trainops last wrote as `name`, or None when it is (`newest`:
    newest_written(kind), when the caller checks several records)."""
    entry = (newest_written(kind) if newest is None else newest).get(name)
    if entry is None:
        return (f"the audit log has no record of trainops writing {kind.removesuffix('_written')} {name!r}: it was "
                "made or copied in by hand")
    if entry.get("content_hash") != audit.sha256_hex(data):
        return (f"{kind.removesuffix('_written')} {name!r} was edited after trainops wrote it (audit entry "
                f"{entry.get('seq')})")
    return None
