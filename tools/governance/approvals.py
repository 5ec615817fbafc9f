"""Human decisions on evidence packs (rule R-APR-1), signed with the approver's own SSH key.

A decision signs the pack's whole content (pack_checks.content_entries: every file, folder and
link) and is final. Decisions on a pack form a chain in `$TRAINOPS_HOME/decisions/PACK/`:
`0001.json`, `0002.json`, ... each carrying the sha256 of the one before, each written once
(never overwritten) and each recorded in the audit log as an anchor the approver signed. A later
decision is only a revocation (approved, then rejected); a rejected pack stays rejected. Deleting
or editing a decision file breaks the chain against its signature, its successor or the audit
log, and then nothing more is decided on that pack.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import BaseModel, Field, ValidationError

from trainops.terminal_text import shown_name
from trainops.tools.governance import anchors, audit, queue, receipts, signing
from trainops.tools.governance.pack_checks import (
    approval_problems,
    changed_entries,
    content_entries,
    content_hash,
)
from trainops.workspace import check_id, home, is_valid_id, packs_dir

Verdict = Literal["approved", "rejected"]
SUBJECT = "pack"


class PackRefused(ValueError):
    """A pack decision was refused: names the rule, the file and what to do."""
def pack_dir(pack: str) -> Path:
    """A pack folder inside `$TRAINOPS_HOME/packs/`: a pack id (matched in full) or a path that
    resolves, symlinks included, to a folder directly inside it."""
    root = packs_dir().resolve()
    if "/" in pack:
        resolved = Path(pack).expanduser().resolve()
        if resolved.parent != root:
            raise PackRefused(f"pack {pack!r} resolves to {resolved}, not a folder inside the workspace's packs "
                              f"{root}: only packs trainops wrote there can be decided")
    else:
        resolved = (root / check_id("pack", pack)).resolve()
        if resolved.parent != root:
            raise PackRefused(f"pack {pack!r} is a link to {resolved}, outside the workspace's packs {root}")
    if not resolved.is_dir():
        known = ", ".join(sorted(p.name for p in root.iterdir() if p.is_dir())) or "none yet"
        raise PackRefused(f"pack {pack!r} not found under {root}; known packs: {known} "
                          "(build one with `trainops evidence build RUN`)")
    return resolved


class DecisionPayload(anchors.SignedPayload):
    """What the approver signs: the decision, the pack's content, the chain link and the audit head."""
    purpose: Literal["decide_pack"] = "decide_pack"
    pack: str
    seq: int = Field(description="1 for the first decision on the pack, then 2, ...")
    decision: Verdict
    note: str = ""
    content_hash: str = Field(description="sha256 over the canonical JSON of the pack's content entries.")
    files: dict[str, str] = Field(description="relative path -> sha256:HEX | dir | symlink:TARGET")
    previous_sha256: str = Field(description="sha256 of the previous decision file's bytes (zeros for the first).")
    issued_at: float
    audit_head: anchors.AuditHead



class Decision(DecisionPayload):
    """One decision file: the signed payload, its signature and the signer it verified as."""
    signature: str
    principal: str = Field(description="The allowed-signers principal who decided.")
    fingerprint: str
    allowed_signers_sha256: str


def decisions_dir(pack_id: str) -> Path:
    return home() / "decisions" / pack_id


def _recorded_decisions(pack_id: str) -> list[dict]:
    try:
        entries = audit.read()
    except audit.AuditUnavailable as exc:
        raise PackRefused(f"decisions on pack {pack_id!r} cannot be checked against the audit log: {exc}") from None
    return [e for e in entries if e.get("kind") == anchors.ANCHOR_KIND and e.get("subject") == SUBJECT
            and e.get("pack") == pack_id]


def load_chain(pack_id: str, check_signatures: bool = True) -> list[tuple[Decision, str]]:
    """The pack's decisions with each file's sha256, oldest first, after checking every file parses,
    links to the one before, matches the audit log's record of it and (unless only listing)
    carries a valid signature by its recorded signer. Raises PackRefused naming the first break."""
    folder = decisions_dir(pack_id)
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    recorded = _recorded_decisions(pack_id)
    chain: list[tuple[Decision, str]] = []
    previous = audit.GENESIS_HASH
    for seq, path in enumerate(files, start=1):
        where = f"decision {path.name} of pack {pack_id!r}"
        raw = path.read_bytes()
        try:
            record = Decision.model_validate_json(raw)
        except (ValidationError, ValueError):
            raise PackRefused(f"{where} is corrupt (not a decision record): restore it from a backup; "
                              "no further decision is taken on this pack") from None
        if path.name != f"{seq:04d}.json" or record.seq != seq or record.pack != pack_id:
            raise PackRefused(f"{where} is out of place (seq {record.seq}, pack {record.pack!r}): decisions were "
                              "renamed, moved or deleted")
        if record.previous_sha256 != previous:
            raise PackRefused(f"{where} does not link to the decision before it: one was edited or removed")
        if check_signatures:
            _check_signature(where, record)
        previous = audit.sha256_hex(raw)
        if seq > len(recorded) or recorded[seq - 1].get("decision_sha256") != previous:
            raise PackRefused(f"{where} is not the decision the audit log records: it was not made through trainops")
        chain.append((record, previous))
    if len(recorded) > len(chain):
        lost = recorded[len(chain)]
        raise PackRefused(f"pack {pack_id!r}: the audit log records decision {len(chain) + 1} "
                          f"({lost.get('decision')} by {lost.get('principal')}, audit entry {lost.get('seq')}) "
                          f"but its file is gone from "
                          f"{folder}: restore it; a deleted decision never lets a pack be decided again")
    _check_receipts(pack_id)
    return chain


def _check_receipts(pack_id: str) -> None:
    """The pack's decisions as the approvers' receipts (outside the workspace) record them: a decision
    cut with its audit line, or its file gone, refuses before anything is read as decided."""
    entries = audit.read()
    problem = receipts.problems(entries, pack=pack_id)
    if problem:
        raise PackRefused(f"pack {pack_id!r}: {problem}")
    for path, receipt in receipts.load():
        if receipt is None or receipt.pack != pack_id or receipt.decision_seq is None:
            continue
        decision = decisions_dir(pack_id) / f"{receipt.decision_seq:04d}.json"
        if not decision.is_file() or audit.sha256_hex(decision.read_bytes()) != receipt.decision_sha256:
            raise PackRefused(f"pack {pack_id!r}: receipt {path.name} records {receipt.what()}, but {decision} is "
                              f"{'gone' if not decision.is_file() else 'not that decision'}: restore it; a decision "
                              "cut from the workspace never lets a pack be decided again")


def _check_signature(where: str, record: Decision) -> None:
    try:
        signer = signing.verify(record.signed_bytes(), record.signature, at=record.issued_at)
    except signing.SigningError as exc:
        raise PackRefused(f"{where}: {exc}") from None
    if (signer.principal, signer.fingerprint) != (record.principal, record.fingerprint):
        raise PackRefused(f"{where} names {record.principal} but is signed by {signer.principal} "
                          f"({signer.fingerprint})")


def _check_final(pack_id: str, chain: list[tuple[Decision, str]], decision: Verdict) -> None:
    if not chain:
        return
    last = chain[-1][0]
    if last.decision == "rejected":
        raise PackRefused(f"pack {pack_id} was rejected by {last.principal} (decision {last.seq}: "
                          f"{last.note}); a rejection is final: build a new pack")
    if decision == "approved":
        raise PackRefused(f"pack {pack_id} was already approved by {last.principal} (decision {last.seq}); "
                          "a decision is final: revoke it with `trainops reject`, or build a new pack")


def decide(pack: str, decision: Verdict, note: str = "", key: Path | None = None, *,
           evidence_problems: Callable[[Path], list[str]]) -> Decision:
    """Sign and record a decision. Approving first runs the pack checks and the evidence validators
    (`evidence_problems`, from trainops.skills.evidence.checks) and refuses a pack that breaks a rule;
    a rejection needs a note; an earlier decision is never overwritten."""
    folder = pack_dir(pack)
    pack_id = folder.name
    if decision == "rejected" and not note.strip():
        raise PackRefused("note is empty: a rejection must say why (--note TEXT) so the pack can be fixed")
    chain = load_chain(pack_id)
    _check_final(pack_id, chain, decision)
    receipts.check_writable()
    entries = content_entries(folder)
    if decision == "approved":
        problems = approval_problems(folder, pack_id, entries, evidence_problems)
        if problems:
            raise PackRefused(f"pack {pack_id} cannot be approved: " + "; ".join(problems))
        changed = changed_entries(entries, content_entries(folder))
        if changed:  # what is signed is what was checked, never a file swapped in meanwhile
            raise PackRefused(f"pack {pack_id} changed while it was checked ({', '.join(changed)}): nothing was "
                              "signed; look at it again")
    payload = DecisionPayload(pack=pack_id, seq=len(chain) + 1, decision=decision, note=note,
                              content_hash=content_hash(entries), files=entries,
                              previous_sha256=chain[-1][1] if chain else audit.GENESIS_HASH,
                              issued_at=time.time(), audit_head=anchors.head())
    signature = signing.sign(payload.signed_bytes(), key)
    signer = signing.verify(payload.signed_bytes(), signature, at=payload.issued_at)
    record = Decision(**payload.model_dump(), signature=signature, principal=signer.principal,
                      fingerprint=signer.fingerprint, allowed_signers_sha256=signer.allowed_signers_sha256)
    path = _write_once(decisions_dir(pack_id) / f"{payload.seq:04d}.json", record.model_dump_json(indent=2).encode())
    try:
        anchors.record(payload.signed_bytes(), signature, signer, subject=SUBJECT, pack=pack_id,
                       decision=decision, decision_seq=payload.seq, decision_sha256=audit.sha256_hex(path.read_bytes()),
                       content_hash=payload.content_hash, note=note)
    except audit.AuditUnavailable as exc:
        path.unlink()
        raise PackRefused(f"nothing was decided: the decision could not be recorded in the audit log ({exc})") from None
    return record


def _write_once(path: Path, data: bytes) -> Path:
    """Create the file or fail: two deciders racing for one sequence number cannot both win."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise PackRefused(f"{path} was written by another decision meanwhile: run the command again") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return path


def unrecorded_decisions(entries: list[dict]) -> list[str]:
    """Decision files (PACK/NNNN.json) whose sha256 no audit anchor records: the workspace's own
    decisions vouch for the log, so a log replaced or rewritten without them fails `audit verify`."""
    recorded = {e.get("decision_sha256") for e in entries if e.get("kind") == anchors.ANCHOR_KIND
                and e.get("subject") == SUBJECT}
    root = home() / "decisions"
    return [path.relative_to(root).as_posix() for path in sorted(root.glob("*/*.json"))
            if audit.sha256_hex(path.read_bytes()) not in recorded]


class PackVerification(BaseModel):
    pack: str
    ok: bool
    decision: str | None = None
    by: str | None = None
    decisions: int = Field(0, description="Length of the decision chain.")
    decided_at: float | None = Field(None, description="When the latest decision was signed.")
    reason: str
    changed: list[str] = Field(default_factory=list, description="Entries added, removed or edited since the decision.")


def verify_pack(pack: str) -> PackVerification:
    """Check the decision chain (signatures by listed approvers, links, audit record) and that no
    entry of the pack changed since the latest decision."""
    folder = pack_dir(pack)
    try:
        chain = load_chain(folder.name)
    except PackRefused as exc:
        return PackVerification(pack=folder.name, ok=False, reason=str(exc))
    if not chain:
        return PackVerification(pack=folder.name, ok=False, reason="no decision yet")
    last = chain[-1][0]
    base = dict(pack=folder.name, decision=last.decision, by=last.principal, decisions=len(chain),
                decided_at=last.issued_at)
    changed = changed_entries(last.files, content_entries(folder))
    if changed:
        return PackVerification(**base, ok=False, changed=changed,
                                reason=f"{len(changed)} entr{'y' if len(changed) == 1 else 'ies'} changed since "
                                       "the decision")
    return PackVerification(**base, ok=True,
                            reason=f"signed by {last.principal} ({last.fingerprint}); content unchanged")


class ApprovalItem(BaseModel):
    kind: Literal["pack", "call"]
    id: str
    status: Literal["pending", "approved", "rejected", "corrupt"]
    detail: str
    by: str | None = None


def _pack_item(folder: Path) -> ApprovalItem:
    """The listing reads the chain without calling ssh-keygen; `verify_pack` checks signatures. A
    folder whose name no pack id can have (a control sequence, a bidi override) is listed escaped
    and marked, never read as a pack."""
    if not is_valid_id(folder.name):
        return ApprovalItem(kind="pack", id=shown_name(folder.name, False), status="corrupt",
                            detail="not a pack trainops wrote: pack ids are letters, digits, '_', '.', '-'; "
                                   "remove this folder from the workspace's packs")
    try:
        chain = load_chain(folder.name, check_signatures=False)
    except PackRefused as exc:
        return ApprovalItem(kind="pack", id=folder.name, status="corrupt", detail=str(exc))
    if not chain:
        return ApprovalItem(kind="pack", id=folder.name, status="pending",
                            detail=f"{len(content_entries(folder))} entries awaiting a decision")
    last = chain[-1][0]
    return ApprovalItem(kind="pack", id=folder.name, status=last.decision, by=last.principal,
                        detail=last.note or f"content {last.content_hash[:12]}")


def list_items() -> list[ApprovalItem]:
    """Pending and decided packs and gated calls, pending first."""
    items = [_pack_item(folder) for folder in sorted(packs_dir().iterdir())
             if folder.is_dir() and not folder.name.startswith(".")]  # .PACK.partial: a write in progress
    for call in queue.pending_calls() + queue.decided_calls():
        why = f"; {call.note}" if call.note else ""
        detail = f"{call.tool} {audit.canonical_json(call.input)} (asked by {call.requested_by}{why})"
        items.append(ApprovalItem(kind="call", id=call.id, status=call.status, by=call.approver, detail=detail))
    return sorted(items, key=lambda i: (i.status != "pending", i.kind, i.id))
