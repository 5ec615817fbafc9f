"""Receipts: every signed decision (approve, reject, revoke) leaves a copy outside the workspace.

Anchors alone do not protect what comes after the newest anchor, and when the newest anchor is
itself the thing cut (a rejection deleted with its line, the head file rewritten) the log still
verifies. So each anchor also leaves a receipt in the approver's own state folder: the signed
payload, its signature, and the audit entry (`seq`, `hash`) it became, under the workspace's id.
The gate and both verifiers check the workspace against the receipts before they honour
anything: a receipt whose entry is gone or different, or an anchor no receipt vouches for, fails
closed naming both. This holds exactly as far as the agent cannot write the receipts folder (a
folder owned by another user in the team set-up, docs/governance.md); a receipt needs no second
signature because a forged one can only make a check fail.

Where: `$TRAINOPS_RECEIPTS_DIR`, else `[governance] receipts_dir` from the user's trusted config
(never a project or workspace trainops.toml), else `$XDG_STATE_HOME/trainops/receipts`
(default ~/.local/state/trainops/receipts); one folder per workspace id inside it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trainops.settings import SettingsError, table
from trainops.workspace import workspace_id as this_workspace

ENV_RECEIPTS_DIR = "TRAINOPS_RECEIPTS_DIR"
ANCHOR_KIND = "anchor"  # the audit entry kind of a signed decision (anchors.py)
# Anchor fields a receipt keeps besides the signed payload: what was decided, on what.
_KEPT = ("subject", "decision", "call_id", "tool", "pack", "decision_seq", "decision_sha256", "content_hash")


class Receipt(BaseModel):
    """What one signed decision left outside the workspace."""
    workspace_id: str | None = None
    audit_seq: int
    entry_hash: str
    signed: str
    signature: str
    principal: str
    subject: str | None = None
    decision: str | None = None
    call_id: str | None = None
    tool: str | None = None
    pack: str | None = None
    decision_seq: int | None = None
    decision_sha256: str | None = None
    content_hash: str | None = None

    def what(self) -> str:
        on = f"pack {self.pack} decision {self.decision_seq}" if self.pack else f"call {self.call_id} ({self.tool})"
        return f"{self.decision} by {self.principal} on {on} at audit entry {self.audit_seq}"


def root() -> Path:
    """The receipts folder (all workspaces): env, then trusted config, then the XDG state folder."""
    explicit = os.environ.get(ENV_RECEIPTS_DIR)
    if explicit:
        return Path(explicit).expanduser()

    values, sources = table("governance", trusted_only=True)
    configured = values.get("receipts_dir")
    if configured is not None:
        if not isinstance(configured, str) or not Path(configured).expanduser().is_absolute():
            raise SettingsError(f"receipts_dir in {sources.get('receipts_dir')} is {configured!r}: give the "
                                "folder's absolute path as a string")
        return Path(configured).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "trainops" / "receipts"


def folder(workspace_id: str | None = None) -> Path:
    return root() / (workspace_id or this_workspace())


def check_writable() -> Path:
    """Fail before anything is signed when no receipt could be left (the decision would be cuttable)."""
    path = folder()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"receipts folder {path} cannot be created ({exc.strerror or exc}): set "
                         f"[governance] receipts_dir (or ${ENV_RECEIPTS_DIR}) to a folder you can write") from None
    if not os.access(path, os.W_OK):
        raise ValueError(f"receipts folder {path} is not writable by you: nothing is signed; set "
                         f"[governance] receipts_dir (or ${ENV_RECEIPTS_DIR}) to a folder you can write")
    return path


def leave(entry: dict[str, Any]) -> Path:
    """Write the receipt of an anchor entry just appended (once: never overwritten)."""
    receipt = Receipt(workspace_id=entry.get("workspace_id"), audit_seq=entry["seq"], entry_hash=entry["hash"],
                      signed=entry["signed"], signature=entry["signature"], principal=entry["principal"],
                      **{k: entry[k] for k in _KEPT if entry.get(k) is not None})
    path = check_writable() / f"{receipt.audit_seq:08d}-{receipt.entry_hash[:12]}.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(receipt.model_dump_json(indent=2) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return path


def load(workspace_id: str | None = None) -> list[tuple[Path, Receipt | None]]:
    """Every receipt of this workspace, oldest first; None for a file that is not a receipt."""
    where = folder(workspace_id)
    out: list[tuple[Path, Receipt | None]] = []
    for path in sorted(where.glob("*.json")) if where.is_dir() else []:
        try:
            out.append((path, Receipt.model_validate_json(path.read_bytes())))
        except (ValidationError, ValueError, OSError):
            out.append((path, None))
    return out


def problems(entries: list[dict[str, Any]], workspace_id: str | None = None, pack: str | None = None) -> str | None:
    """The first way the log `entries` disagrees with the receipts (every one, or one pack's), or None:
    a receipt whose anchor is gone or altered, or an anchor that no receipt vouches for."""
    found = load(workspace_id)
    where = folder(workspace_id)
    receipted = set()
    for path, receipt in found:
        if receipt is None:
            return f"receipt {path} is not a receipt: restore it (`trainops approve/reject` write each one once)"
        if pack is not None and receipt.pack != pack:
            continue
        receipted.add(receipt.signature)
        at = entries[receipt.audit_seq - 1] if 0 < receipt.audit_seq <= len(entries) else None
        if at is None:
            return (f"receipt {path.name} in {where} records {receipt.what()}, but the audit log ends at entry "
                    f"{len(entries)}: the signed decision was cut from the log; restore the log from a backup")
        if (at.get("hash"), at.get("signature"), at.get("signed")) != (receipt.entry_hash, receipt.signature,
                                                                          receipt.signed):
            return (f"receipt {path.name} in {where} records {receipt.what()}, but audit entry {receipt.audit_seq} is "
                    f"now a {at.get('kind')!r} entry ({str(at.get('hash'))[:12]}): the signed decision was cut or "
                    "rewritten; restore the log from a backup")
    for entry in entries:
        if entry.get("kind") == ANCHOR_KIND and entry.get("signature") not in receipted \
                and (pack is None or entry.get("pack") == pack):
            return (f"anchor at audit entry {entry.get('seq')} ({entry.get('decision')} by {entry.get('principal')}) "
                    f"has no receipt in {where}: it was not made by `trainops approve/reject` with these receipts "
                    f"([governance] receipts_dir / ${ENV_RECEIPTS_DIR} must name the approvers' receipts folder)")
    return None
