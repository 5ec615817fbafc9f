"""Human decisions on evidence packs (rule R-APR-1).

A decision signs the pack's content hash (every file in the pack folder except
`approval.json`) with the workspace ed25519 key. Once decided, the pack is frozen: any later
change to a file makes `verify_pack` fail, and a second decision is refused. Anyone with the
public key can check an approval.
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from trainops.tools.governance import audit, signing

APPROVAL_FILE = "approval.json"


def pack_dir(pack: str) -> Path:
    """A pack id under `$TRAINOPS_HOME/packs/`, or a path to a pack folder."""
    from trainops.workspace import check_id, packs_dir

    as_path = Path(pack)
    if as_path.is_dir() and (as_path.is_absolute() or "/" in pack):
        return as_path.resolve()
    path = packs_dir() / check_id("pack", pack)
    if not path.is_dir():
        known = ", ".join(sorted(p.name for p in packs_dir().iterdir() if p.is_dir())) or "none yet"
        raise ValueError(f"pack {pack!r} not found under {packs_dir()}; known packs: {known} "
                         "(build one with `trainops evidence build RUN`)")
    return path


def file_hashes(folder: Path) -> dict[str, str]:
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != APPROVAL_FILE:
            out[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def content_hash(hashes: dict[str, str]) -> str:
    return audit.sha256_hex(audit.canonical_json(hashes))


class Decision(BaseModel):
    """`approval.json`: the signed human decision on one pack."""

    pack: str
    decision: Literal["approved", "rejected"]
    by: str = Field(description="The person who decided.")
    note: str = ""
    time: float
    content_hash: str = Field(description="sha256 over the canonical JSON of {relative path: file sha256}.")
    files: dict[str, str]
    public_key_pem: str = Field(description="The key the signature verifies under (also in keys/).")
    signature: str = ""

    def signed_bytes(self) -> bytes:
        return audit.canonical_json(self.model_dump(exclude={"signature"})).encode()


def decide(pack: str, decision: Literal["approved", "rejected"], by: str, note: str = "") -> Decision:
    folder = pack_dir(pack)
    if not by.strip():
        raise ValueError("by is empty: name the person deciding (--by NAME)")
    if decision == "rejected" and not note.strip():
        raise ValueError("note is empty: a rejection must say why (--note TEXT) so the pack can be fixed")
    existing = folder / APPROVAL_FILE
    if existing.exists():
        prior = Decision.model_validate_json(existing.read_text())
        raise ValueError(f"pack {folder.name} was already {prior.decision} by {prior.by}; a decided pack is "
                         "immutable: build a new pack to decide again")
    hashes = file_hashes(folder)
    if not hashes:
        raise ValueError(f"pack {folder.name} has no files to approve: build it first")
    record = Decision(pack=folder.name, decision=decision, by=by, note=note, time=time.time(),
                      content_hash=content_hash(hashes), files=hashes, public_key_pem=signing.public_key_pem())
    record.signature = signing.sign(record.signed_bytes())
    existing.write_text(record.model_dump_json(indent=2))
    audit.append("approval", subject="pack", pack=folder.name, decision=decision, approver=by,
                 content_hash=record.content_hash, note=note)
    return record


class PackVerification(BaseModel):
    pack: str
    ok: bool
    decision: str | None = None
    by: str | None = None
    reason: str
    changed: list[str] = Field(default_factory=list, description="Files added, removed or edited since the decision.")


def verify_pack(pack: str, public_key_pem: str | None = None) -> PackVerification:
    """Check the signature (under the given key, else the workspace key) and that no file changed."""
    folder = pack_dir(pack)
    path = folder / APPROVAL_FILE
    if not path.exists():
        return PackVerification(pack=folder.name, ok=False, reason="no decision yet (no approval.json)")
    record = Decision.model_validate_json(path.read_text())
    key = public_key_pem if public_key_pem is not None else signing.public_key_pem()
    base = dict(pack=folder.name, decision=record.decision, by=record.by)
    if not signing.verify(record.signed_bytes(), record.signature, key):
        return PackVerification(**base, ok=False, reason="signature does not verify under the public key: "
                                                         "approval.json was altered or signed by another key")
    now = file_hashes(folder)
    changed = sorted(k for k in now.keys() | record.files.keys() if now.get(k) != record.files.get(k))
    if changed or content_hash(now) != record.content_hash:
        return PackVerification(**base, ok=False, changed=changed,
                                reason=f"{len(changed)} file(s) changed since the decision")
    return PackVerification(**base, ok=True, reason="signature valid and content unchanged")


class ApprovalItem(BaseModel):
    kind: Literal["pack", "call"]
    id: str
    status: Literal["pending", "approved", "rejected", "corrupt"]
    detail: str
    by: str | None = None


def list_items() -> list[ApprovalItem]:
    """Pending and decided packs and gated calls, pending first."""
    from trainops.tools.governance import queue
    from trainops.workspace import packs_dir

    items = []
    for folder in sorted(p for p in packs_dir().iterdir() if p.is_dir()):
        path = folder / APPROVAL_FILE
        if path.exists():
            record = Decision.model_validate_json(path.read_text())
            items.append(ApprovalItem(kind="pack", id=folder.name, status=record.decision, by=record.by,
                                      detail=record.note or f"content {record.content_hash[:12]}"))
        else:
            items.append(ApprovalItem(kind="pack", id=folder.name, status="pending",
                                      detail=f"{len(file_hashes(folder))} file(s) awaiting a decision"))
    for call in queue.pending_calls() + queue.decided_calls():
        why = f"; {call.note}" if call.note else ""
        items.append(ApprovalItem(kind="call", id=call.id, status=call.status, by=call.approver,
                                  detail=f"{call.tool} {audit.canonical_json(call.input)} (asked by {call.requested_by}{why})"))
    return sorted(items, key=lambda i: (i.status != "pending", i.kind, i.id))
