"""Audit anchors: each human approval signs the audit log's head at that moment (rule R-SEC-5).

The hash chain alone stops nobody who can rewrite both the log and its head file: they can
recompute every hash. An anchor is an audit entry that carries a payload a human signed with
their SSH key; the payload names the head (`seq`, `hash`) the approver saw. Rewriting any
entry at or before that head changes its hash, and the signature cannot be redone without the
human's key, so `verification.verify` (which calls `problems`) names the broken anchor.

A signed payload is JSON with `audit_head: {seq, hash}` and `issued_at` (the time the
allowed-signers file is consulted for, so a key retired later with `valid-before` still
vouches for what it signed while valid).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trainops.tools.governance import audit, signing

ANCHOR_KIND = "anchor"


class SignedPayload(BaseModel):
    """What an approver signs: the canonical JSON of the payload's own fields. A record that
    extends a payload with its signature and signer still signs (and verifies) the same bytes."""

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
    """Append the anchor: the signed payload as text, its signature and who signed it."""
    return audit.append(ANCHOR_KIND, path, signed=signed.decode("utf-8"), signature=signature,
                        principal=signer.principal, fingerprint=signer.fingerprint,
                        allowed_signers_sha256=signer.allowed_signers_sha256, **fields)


class _Anchored(BaseModel):
    audit_head: AuditHead
    issued_at: float


def problems(entries: list[dict[str, Any]]) -> tuple[int, str] | None:
    """The first anchor (1-based line, reason) whose signature or signed head does not hold, or None.
    `entries` is the whole log, already checked as a chain."""
    for line, entry in enumerate(entries, start=1):
        if entry.get("kind") != ANCHOR_KIND:
            continue
        reason = _anchor_problem(entry, entries[:line - 1])
        if reason:
            return line, f"anchor at entry {entry.get('seq')} by {entry.get('principal')!r}: {reason}"
    return None


def _anchor_problem(entry: dict[str, Any], before: list[dict[str, Any]]) -> str:
    signed = entry.get("signed")
    try:
        payload = _Anchored.model_validate(json.loads(signed))
    except (TypeError, ValueError, ValidationError):
        return "its signed payload is not an anchored approval (no audit_head/issued_at)"
    seq = payload.audit_head.seq
    if seq > len(before) or seq < 0:
        return f"it signs head entry {seq}, which is not before it"
    expected = audit.GENESIS_HASH if seq == 0 else before[seq - 1]["hash"]
    if expected != payload.audit_head.hash:
        return (f"entry {seq} now hashes to {expected[:12]} but the approver signed {payload.audit_head.hash[:12]}: "
                "history up to that entry was rewritten after the approval")
    try:
        signer = signing.verify(signed.encode("utf-8"), entry.get("signature", ""), at=payload.issued_at)
    except signing.SigningError as exc:
        return f"its signature does not hold ({exc})"
    if signer.principal != entry.get("principal") or signer.fingerprint != entry.get("fingerprint"):
        return (f"the signature is by {signer.principal} ({signer.fingerprint}), not the recorded "
                f"{entry.get('principal')} ({entry.get('fingerprint')})")
    return ""
