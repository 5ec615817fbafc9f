"""Audit anchors: each human approval signs the audit log's head at that moment (rule R-SEC-5).

The hash chain alone stops nobody who can rewrite both the log and its head file: they can
recompute every hash. An anchor is an audit entry that carries a payload a human signed with
their SSH key; the payload names the head (`seq`, `hash`) the approver saw. Rewriting any
entry at or before that head changes its hash, and the signature cannot be redone without the
human's key, so `verification.verify` (which calls `problems`) names the broken anchor.

A signed payload is JSON with `audit_head: {seq, hash}`, `issued_at` (the time the
allowed-signers file is consulted for, so a key retired later with `valid-before` still
vouches for what it signed while valid) and `workspace_id` (the workspace it was signed in:
a copy appended to another workspace's log vouches for nothing there). Each anchor also leaves
a receipt outside the workspace (receipts.py), so cutting the newest anchor is detected too.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from trainops.tools.governance import audit, receipts, signing
from trainops.tools.governance.receipts import ANCHOR_KIND
from trainops.workspace import workspace_id


def _this_workspace() -> str:
    return workspace_id()


class SignedPayload(BaseModel):
    """What an approver signs: the canonical JSON of the payload's own fields. A record that
    extends a payload with its signature and signer still signs (and verifies) the same bytes.
    Every payload names the workspace it was signed in (a payload read without one gets this
    workspace's id, which its signature then does not cover: refused as forged)."""
    workspace_id: str = Field(default_factory=_this_workspace,
                              description="The workspace (`workspace.id`) the approver signed in.")

    def signed_bytes(self) -> bytes:
        payload = next(c for c in type(self).__mro__ if SignedPayload in c.__bases__)
        return audit.canonical_json(self.model_dump(mode="json", include=set(payload.model_fields))).encode()


class AuditHead(BaseModel):
    """The last entry of the audit log when an approver signed: 0 and the genesis hash for an empty log."""
    seq: int
    hash: str


def head(path: Path | None = None) -> AuditHead:
    """The log's last entry as it is now (what an approver signs)."""
    entries = audit.read(path, tail=1)
    if not entries:
        return AuditHead(seq=0, hash=audit.GENESIS_HASH)
    return AuditHead(seq=entries[-1]["seq"], hash=entries[-1]["hash"])


def record(signed: bytes, signature: str, signer: signing.Signer, path: Path | None = None,
           **fields: Any) -> dict[str, Any]:
    """Append the anchor (the signed payload as text, its signature and who signed it) and, for the
    workspace's own log, leave its receipt outside the workspace."""
    workspace = json.loads(signed).get("workspace_id")
    if path is None:
        receipts.check_writable()
    entry = audit.append(ANCHOR_KIND, path, signed=signed.decode("utf-8"), signature=signature,
                         principal=signer.principal, fingerprint=signer.fingerprint,
                         allowed_signers_sha256=signer.allowed_signers_sha256, workspace_id=workspace, **fields)
    if path is None:
        receipts.leave(entry)
    return entry


class _Anchored(BaseModel):
    audit_head: AuditHead
    issued_at: float
    workspace_id: str | None = None


def problems(entries: list[dict[str, Any]], workspace_id: str | None = None) -> tuple[int, str] | None:
    """The first anchor (1-based line, reason) whose signature, signed head or (given `workspace_id`)
    workspace does not hold, or None. `entries` is the whole log, already checked as a chain."""
    for line, entry in enumerate(entries, start=1):
        if entry.get("kind") != ANCHOR_KIND:
            continue
        reason = head_problem(entry, entries[:line - 1], workspace_id) or _signature_problem(entry)
        if reason:
            return line, f"anchor at entry {entry.get('seq')} by {entry.get('principal')!r}: {reason}"
    return None


def head_problem(entry: dict[str, Any], before: list[dict[str, Any]], workspace_id: str | None = None) -> str:
    """Why an anchor does not belong where it stands (its signed head is not the log before it, or it
    was signed in another workspace), without checking the signature; '' when it does."""
    try:
        payload = _Anchored.model_validate(json.loads(entry.get("signed")))
    except (TypeError, ValueError, ValidationError):
        return "its signed payload is not an anchored approval (no audit_head/issued_at)"
    if workspace_id is not None and payload.workspace_id != workspace_id:
        return (f"it was signed in workspace {payload.workspace_id}, not this one ({workspace_id}): "
                "an approval copied from another workspace's log")
    seq = payload.audit_head.seq
    if seq > len(before) or seq < 0:
        return f"it signs head entry {seq}, which is not before it"
    expected = audit.GENESIS_HASH if seq == 0 else before[seq - 1]["hash"]
    if expected != payload.audit_head.hash:
        return (f"entry {seq} now hashes to {expected[:12]} but the approver signed {payload.audit_head.hash[:12]}: "
                "history up to that entry was rewritten after the approval")
    return ""


def _signature_problem(entry: dict[str, Any]) -> str:
    signed = entry.get("signed")
    payload = _Anchored.model_validate(json.loads(signed))
    try:
        signer = signing.verify(signed.encode("utf-8"), entry.get("signature", ""), at=payload.issued_at)
    except signing.SigningError as exc:
        return f"its signature does not hold ({exc})"
    if signer.principal != entry.get("principal") or signer.fingerprint != entry.get("fingerprint"):
        return (f"the signature is by {signer.principal} ({signer.fingerprint}), not the recorded "
                f"{entry.get('principal')} ({entry.get('fingerprint')})")
    return ""
