"""Approval tokens for gated tool calls (rules R-SEC-4, R-SEC-6); the queue lives in `queue.py`.

A human approves one *queued* call by signing, with their own SSH key, a payload that binds
the call (id, tool, input sha256), a nonce shared by every co-signer, an expiry and the audit
head they saw (an anchor, see anchors.py). A token is the list of those signed approvals. It
opens exactly one call when every signature verifies against the allowed-signers file, the
distinct approvers (principals and keys, never the requester) reach what the tool's class
needs, it has not expired, the call was not rejected after it was minted, and its nonce was
never spent, and each approval is anchored in this workspace's audit log.
"""
from __future__ import annotations

import base64
import fcntl
import json
import math
import secrets
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from trainops.settings import table
from trainops.tools.governance import anchors, audit, queue, receipts, signing
from trainops.tools.governance.queue import call_id, input_hash
from trainops.workspace import workspace_id

TOKEN_PREFIX = "tok1."
DEFAULT_TTL_MIN = 15.0
DEFAULT_MAX_TTL_MIN = 60.0
# Distinct human approvers a gated call needs, by class (AGENTS.md R-SEC-6).
APPROVERS_NEEDED = {"mutate": 1, "irreversible": 2, "tenant-governance": 2}

RefusalReason = Literal["forbidden", "invalid_input", "missing_token", "malformed", "forged", "mismatch",
                        "expired", "replayed", "revoked", "too_few_approvers", "requester", "not_queued",
                        "decisions_cut", "outside_change_window"]


class TokenRefused(Exception):
    def __init__(self, reason: RefusalReason, message: str):
        super().__init__(message)
        self.reason = reason


class ApprovalPayload(anchors.SignedPayload):
    """What one approver signs."""
    purpose: Literal["approve_call"] = "approve_call"
    call_id: str
    tool: str
    input_sha256: str
    nonce: str
    issued_at: float
    expires_at: float
    audit_head: anchors.AuditHead



class Approval(BaseModel):
    payload: ApprovalPayload
    signature: str


def approval_class(tool: str) -> str:
    """The class that sets how many approvers a tool needs; an unknown tool gets the strictest."""
    spec = queue.tool_spec(tool)
    if spec is None:
        return "irreversible"
    if "tenant-governance" in spec.tags:
        return "tenant-governance"
    return "irreversible" if spec.risk == "irreversible" else "mutate"


def is_emergency(tool: str, inp: BaseModel | dict[str, Any] | None) -> bool:
    """A change-window tool's call marked emergency=true (R-CHG-1): it may land outside a change
    window, so one more human than its class needs must sign it."""
    spec = queue.tool_spec(tool)
    value = inp.get("emergency") if isinstance(inp, dict) else getattr(inp, "emergency", False)
    return spec is not None and "change-window" in spec.tags and value is True


def approvers_needed(tool: str, inp: BaseModel | dict[str, Any] | None = None) -> int:
    """Distinct approvers `tool` needs by its class (R-SEC-6), one more for an emergency change (R-CHG-1)."""
    return APPROVERS_NEEDED[approval_class(tool)] + is_emergency(tool, inp)


def needed_reason(tool: str, inp: BaseModel | dict[str, Any] | None = None) -> str:
    """The class behind `approvers_needed`, as an approver reads it: 'tenant-governance, emergency +1'."""
    return approval_class(tool) + (", emergency +1" if is_emergency(tool, inp) else "")


def max_ttl_min() -> float:
    """`[governance] max_token_ttl_min` from the user's trusted config (default 60)."""
    value = table("governance", trusted_only=True)[0].get("max_token_ttl_min", DEFAULT_MAX_TTL_MIN)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"[governance] max_token_ttl_min is {value!r}: give a positive, finite number of minutes")
    return float(value)


def check_ttl_min(ttl_min: float) -> float:
    """A token lifetime that ends: finite, positive, at most the configured maximum."""
    limit = max_ttl_min()
    if isinstance(ttl_min, bool) or not isinstance(ttl_min, (int, float)) or not math.isfinite(ttl_min) or ttl_min <= 0:
        raise ValueError(f"ttl_min is {ttl_min!r}: give a positive, finite number of minutes (--ttl-min, "
                         f"default {DEFAULT_TTL_MIN:g}, at most {limit:g})")
    if ttl_min > limit:
        raise ValueError(f"ttl_min is {ttl_min:g}: at most {limit:g} minutes ([governance] max_token_ttl_min)")
    return float(ttl_min)


def approve(call: str | queue.SignableCall, key: Path | None = None, ttl_min: float = DEFAULT_TTL_MIN,
            cosign: str | None = None) -> str:
    """Sign one queued call with the approver's key (None: ssh-agent); `cosign` adds this
    signature to another approver's token. `call` is the pending id, or the `SignableCall` the
    approver was shown: exactly its bytes are signed, and only while the queue still holds them.
    Returns the token; the approval is anchored in the audit log."""
    ttl_s = check_ttl_min(ttl_min) * 60
    shown = call if isinstance(call, queue.SignableCall) else queue.signable(call)
    item = shown.item
    if queue.signable(item.id).input_bytes != shown.input_bytes:
        raise ValueError(f"queued call {item.id} changed after it was shown: nothing was signed; "
                         "look at it again with `trainops approvals`")
    earlier = parse(cosign) if cosign else []
    if earlier and any((a.payload.call_id, a.payload.tool, a.payload.input_sha256)
                       != (shown.call_id, item.tool, shown.input_sha256) for a in earlier):
        raise ValueError(f"--cosign token is for call {earlier[0].payload.call_id}, not {shown.call_id}: "
                         "co-sign the same call")
    now = time.time()
    payload = ApprovalPayload(call_id=shown.call_id, tool=item.tool, input_sha256=shown.input_sha256,
                              nonce=earlier[0].payload.nonce if earlier else secrets.token_hex(16), issued_at=now,
                              expires_at=now + ttl_s, audit_head=anchors.head())
    signature = signing.sign(payload.signed_bytes(), key)
    signer = signing.verify(payload.signed_bytes(), signature)
    _refuse_requester(item, [signer])
    if any(_same_person(signer, s) for s in signers(earlier)):
        raise ValueError(f"{signer.principal} already signed this token: a second approver must co-sign")
    anchors.record(payload.signed_bytes(), signature, signer, subject="call", decision="token_issued",
                   tool=item.tool, call_id=item.id, expires_at=payload.expires_at)
    return encode([*earlier, Approval(payload=payload, signature=signature)])


def approval_prompt(shown: queue.SignableCall) -> list[str]:
    """What an approver reads before signing `shown`: the call in full and who else must sign."""
    tool, inp = shown.item.tool, shown.item.input
    return [*shown.lines(), f"  approvers needed {approvers_needed(tool, inp)} ({needed_reason(tool, inp)}), distinct, "
                            "never the requester"]


def encode(approvals: list[Approval]) -> str:
    body = audit.canonical_json([a.model_dump(mode="json") for a in approvals]).encode()
    return TOKEN_PREFIX + base64.urlsafe_b64encode(body).decode().rstrip("=")


def parse(token: str) -> list[Approval]:
    """The approvals in a well-formed token (signatures not checked)."""
    how = "mint one with `trainops approve --pending ID`"
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
        raise TokenRefused("malformed", f"approval token is not a trainops token (no {TOKEN_PREFIX!r} prefix): {how}")
    body = token[len(TOKEN_PREFIX):].strip()
    try:
        raw = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        approvals = [Approval.model_validate(a) for a in raw]
    except (ValueError, TypeError, ValidationError) as exc:
        raise TokenRefused("malformed", f"approval token cannot be read ({type(exc).__name__}): {how}") from None
    if not approvals:
        raise TokenRefused("malformed", f"approval token carries no approval: {how}")
    return approvals


def decode(token: str) -> dict[str, Any]:
    """The first approval's payload (signatures not checked): what the token is for."""
    return parse(token)[0].payload.model_dump(mode="json")


def signers(approvals: list[Approval], now: float | None = None) -> list[signing.Signer]:
    """Who signed each approval, checked against the allowed signers; a bad signature is `forged`."""
    signers = []
    for approval in approvals:
        try:
            signers.append(signing.verify(approval.payload.signed_bytes(), approval.signature, at=now))
        except signing.SigningError as exc:
            raise TokenRefused("forged", f"approval token signature refused: {exc}") from None
    return signers


def _same_person(a: signing.Signer, b: signing.Signer) -> bool:
    return a.principal == b.principal or a.fingerprint == b.fingerprint


def _refuse_requester(item: queue.PendingCall, signed_by: list[signing.Signer]) -> None:
    asked = queue.requesters(item, queue.history(item.id))
    for signer in signed_by:
        if asked & {signer.principal.lower(), signer.principal.split("@")[0].lower()}:
            raise TokenRefused("requester", f"{signer.principal} requested call {item.id}: the requester never "
                                            "approves their own call; ask another approver")


def consume(token: str, tool: str, inp: BaseModel | dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """Check the token against this exact queued call and burn it; raise TokenRefused naming why not.
    Returns the first payload with `approver` (the principals, comma-separated) and `approvers`."""
    approvals = parse(token)
    entries = audit.read()
    _check_receipts(entries)
    first = approvals[0].payload
    if any((a.payload.call_id, a.payload.tool, a.payload.input_sha256, a.payload.nonce)
           != (first.call_id, first.tool, first.input_sha256, first.nonce) for a in approvals):
        raise TokenRefused("malformed", "approval token mixes approvals of different calls or nonces")
    if first.tool != tool:
        raise TokenRefused("mismatch", f"approval token is for tool {first.tool!r}, not {tool!r}: "
                                       "approve this exact call")
    if first.input_sha256 != input_hash(inp) or first.call_id != call_id(tool, inp):
        raise TokenRefused("mismatch", f"approval token was issued for a different input of {tool} "
                                       "(input hash differs): approve this exact input")
    now = time.time() if now is None else now
    _check_times(approvals, now)
    signed_by = signers(approvals, now)
    history = queue.history(first.call_id)
    _check_not_revoked(first.call_id, approvals, history)
    _check_anchored(first.call_id, approvals, history)
    _check_bound_here(approvals, entries)
    item = _queued(first)
    _refuse_requester(item, signed_by)
    distinct: list[signing.Signer] = []
    for signer in signed_by:
        if not any(_same_person(signer, seen) for seen in distinct):
            distinct.append(signer)
    needed = approvers_needed(tool, inp)
    if len(distinct) < needed:
        names = ", ".join(s.principal for s in distinct)
        raise TokenRefused("too_few_approvers", f"{tool} ({needed_reason(tool, inp)}) needs {needed} distinct "
                                                f"approvers; this token has {len(distinct)} ({names}): another "
                                                f"approver co-signs with `trainops approve --pending {first.call_id} "
                                                "--cosign TOKEN`")
    principals = [s.principal for s in distinct]
    _spend(first.nonce, first.call_id, principals, distinct[0].allowed_signers_sha256)
    queue.resolve(first.call_id, ", ".join(principals))
    return {**first.model_dump(mode="json"), "approver": ", ".join(principals), "approvers": principals}


def _queued(payload: ApprovalPayload) -> queue.PendingCall:
    try:
        return queue.get_pending(payload.call_id)
    except ValueError as exc:
        if payload.nonce in _spent_nonces():
            raise TokenRefused("replayed", "approval token was already used: a token opens one call only") from None
        raise TokenRefused("not_queued", f"tokens open only queued calls: {exc}") from None


def _check_times(approvals: list[Approval], now: float) -> None:
    limit_s = max_ttl_min() * 60
    for approval in approvals:
        issued, expires = approval.payload.issued_at, approval.payload.expires_at
        if not (math.isfinite(issued) and math.isfinite(expires)) or not 0 < expires - issued <= limit_s + 1:
            raise TokenRefused("malformed", f"approval token lifetime {expires - issued!r} s is not within "
                                            f"(0, {limit_s:g}] s ([governance] max_token_ttl_min)")
        if now > expires:
            raise TokenRefused("expired", f"approval token expired {now - expires:.0f} s ago: "
                                          "ask the approver for a new one")


def _check_anchored(item_id: str, approvals: list[Approval], history: list[dict[str, Any]]) -> None:
    """Every approval must be the one this workspace's audit log anchored when it was made: a
    signature made outside `trainops approve`, or in another workspace, opens nothing here."""
    anchored = {e.get("signature") for e in history if e.get("kind") == anchors.ANCHOR_KIND}
    if any(a.signature not in anchored for a in approvals):
        raise TokenRefused("not_queued", f"an approval in this token is not recorded in this workspace's audit log "
                                         f"for call {item_id}: approve the queued call here with "
                                         f"`trainops approve --pending {item_id}`")


def _check_receipts(entries: list[dict[str, Any]]) -> None:
    """Before any token is honoured: the log still holds every signed decision its receipts record
    (a rejection cut from the end would otherwise let a revoked token run)."""
    problem = receipts.problems(entries)
    if problem:
        raise TokenRefused("decisions_cut", f"no token is honoured in this workspace: {problem}")


def _check_bound_here(approvals: list[Approval], entries: list[dict[str, Any]]) -> None:
    """Each approval was signed in this workspace, and its anchor's signed head is this log's entry:
    an anchor copied in from another workspace's log vouches for nothing here."""
    here = workspace_id()
    for approval in approvals:
        if approval.payload.workspace_id != here:
            raise TokenRefused("mismatch", f"an approval in this token was signed in workspace "
                                           f"{approval.payload.workspace_id}, not this one ({here}): approve the "
                                           "call queued here with `trainops approve --pending "
                                           f"{approval.payload.call_id}`")
        line = next((n for n, e in enumerate(entries) if e.get("kind") == anchors.ANCHOR_KIND
                     and e.get("signature") == approval.signature), None)
        if line is None:
            raise TokenRefused("not_queued", "an approval in this token is not anchored in this workspace's audit "
                                             "log: approve the call queued here")
        problem = anchors.head_problem(entries[line], entries[:line], here)
        if problem or entries[line].get("signed") != approval.payload.signed_bytes().decode("utf-8"):
            raise TokenRefused("not_queued", f"the anchor of this approval (audit entry {entries[line].get('seq')}) "
                                             f"does not belong to this log: {problem or 'it signs other bytes'}")


def _check_not_revoked(item_id: str, approvals: list[Approval], history: list[dict[str, Any]]) -> None:
    rejected_at = queue.rejected_at(history)
    if rejected_at is not None and any(a.payload.issued_at <= rejected_at for a in approvals):
        raise TokenRefused("revoked", f"call {item_id} was rejected after this token was minted: the token is "
                                      "revoked; queue the call again and ask for a new approval")


def _spent_nonces() -> set[str]:
    return {e.get("nonce") for e in audit.read() if e.get("kind") == "token_spent"}


def _spend(nonce: str, item_id: str, principals: list[str], allowed_signers_sha256: str) -> None:
    """Burn the nonce in the audit log (tamper-evident, unlike a file beside it), once, under a lock."""
    with open(queue.gov_dir("tokens") / "spend.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if nonce in _spent_nonces():
            raise TokenRefused("replayed", "approval token was already used: a token opens one call only")
        audit.append("token_spent", call_id=item_id, nonce=nonce, approvers=principals,
                     allowed_signers_sha256=allowed_signers_sha256)
