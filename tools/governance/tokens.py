"""Approval tokens for gated tool calls, and the queue of calls waiting for one (rule R-SEC-4).

A token is `payload.signature`: the payload (base64url JSON) binds the tool name, the sha256
of the canonical JSON input, the approver, a nonce and an expiry; the signature is ed25519
by the workspace approval key. A token opens exactly one call: its nonce is recorded when
used, so a replay is refused.
"""
from __future__ import annotations

import fcntl
import json
import re
import secrets
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from trainops.tools.governance import audit, signing

DEFAULT_TTL_S = 15 * 60

RefusalReason = Literal[
    "forbidden", "invalid_input", "missing_token", "malformed", "forged", "mismatch", "expired", "replayed"
]


class TokenRefused(Exception):
    def __init__(self, reason: RefusalReason, message: str):
        super().__init__(message)
        self.reason = reason


def input_hash(inp: BaseModel | dict[str, Any]) -> str:
    data = inp.model_dump(mode="json") if isinstance(inp, BaseModel) else inp
    return audit.sha256_hex(audit.canonical_json(data))


def call_id(tool: str, inp: BaseModel | dict[str, Any]) -> str:
    """Stable id of one exact call: the same tool and input always map to the same pending item."""
    return audit.sha256_hex(f"{tool}:{input_hash(inp)}")[:12]


def _gov_dir(name: str) -> Path:
    from trainops.workspace import home

    path = home() / "governance" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def issue_token(tool: str, inp: BaseModel | dict[str, Any], approver: str, ttl_s: float = DEFAULT_TTL_S) -> str:
    """A human approves one exact call: sign (tool, input hash) for `ttl_s` seconds, single use."""
    if not approver.strip():
        raise ValueError("approver is empty: pass the approving person's name (--by NAME)")
    if ttl_s <= 0:
        raise ValueError(f"ttl_s is {ttl_s}: give a positive lifetime in seconds (default {DEFAULT_TTL_S})")
    inp = _validated(tool, inp)
    now = time.time()
    payload = {
        "tool": tool,
        "input_sha256": input_hash(inp),
        "approver": approver,
        "issued_at": now,
        "expires_at": now + ttl_s,
        "nonce": secrets.token_hex(16),
    }
    body = signing.b64(audit.canonical_json(payload).encode())
    token = f"{body}.{signing.sign(body.encode())}"
    audit.append("approval", subject="call", tool=tool, input_sha256=payload["input_sha256"],
                 approver=approver, decision="token_issued", expires_at=payload["expires_at"],
                 call_id=call_id(tool, inp))
    return token


def _validated(tool: str, inp: BaseModel | dict[str, Any]) -> BaseModel:
    """Approve the input as the tool will see it (defaults filled in), so the hashes match."""
    if isinstance(inp, BaseModel):
        return inp
    from pydantic import ValidationError

    from trainops.tools.base import ToolError, get

    try:
        return get(tool).Input.model_validate(inp)
    except ToolError as exc:
        raise ValueError(str(exc)) from None
    except ValidationError as exc:
        fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"input is not a valid {tool} input: {fields}") from None


def decode(token: str) -> dict[str, Any]:
    """The payload of a well-formed token (signature not checked)."""
    try:
        body, _sig = token.split(".")
        payload = json.loads(signing.unb64(body))
    except (ValueError, json.JSONDecodeError) as exc:
        raise TokenRefused("malformed", f"approval token is not a trainops token ({exc}); mint one with "
                                        "`trainops approve --call TOOL --input JSON --by NAME`") from None
    if not isinstance(payload, dict) or not {"tool", "input_sha256", "expires_at", "nonce"} <= payload.keys():
        raise TokenRefused("malformed", "approval token payload lacks tool/input_sha256/expires_at/nonce")
    return payload


def consume(token: str, tool: str, inp: BaseModel | dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """Check the token against this exact call and burn it; raise TokenRefused naming why not."""
    payload = decode(token)
    body, sig = token.split(".")
    if not signing.verify(body.encode(), sig):
        raise TokenRefused("forged", "approval token signature does not verify against this workspace's "
                                     "approval key: the token was altered or signed by another key")
    if payload["tool"] != tool:
        raise TokenRefused("mismatch", f"approval token is for tool {payload['tool']!r}, not {tool!r}: "
                                       "approve this exact call")
    if payload["input_sha256"] != input_hash(inp):
        raise TokenRefused("mismatch", f"approval token was issued for a different input of {tool} "
                                       "(input hash differs): approve this exact input")
    now = time.time() if now is None else now
    if now > payload["expires_at"]:
        ago_s = now - payload["expires_at"]
        raise TokenRefused("expired", f"approval token expired {ago_s:.0f} s ago: ask the approver for a new one")
    used = _gov_dir("tokens") / "used_nonces.txt"
    with open(used.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        seen = used.read_text().split() if used.exists() else []
        if payload["nonce"] in seen:
            raise TokenRefused("replayed", "approval token was already used: a token opens one call only")
        with open(used, "a", encoding="utf-8") as fh:
            fh.write(payload["nonce"] + "\n")
    _resolve_pending(call_id(tool, inp), payload.get("approver", ""))
    return payload


class PendingCall(BaseModel):
    """A gated call that arrived without a token and waits for a human."""

    id: str
    tool: str
    input: dict[str, Any]
    requested_by: str
    time: float
    status: Literal["pending", "approved", "rejected"] = "pending"
    approver: str | None = Field(None, description="Who decided: approved once a token for it was used, or rejected.")
    note: str = ""


def record_pending(tool: str, inp: BaseModel, requested_by: str) -> PendingCall:
    item = PendingCall(id=call_id(tool, inp), tool=tool, input=inp.model_dump(mode="json"),
                       requested_by=requested_by, time=time.time())
    path = _gov_dir("pending") / f"{item.id}.json"
    if path.exists():
        return PendingCall.model_validate_json(path.read_text())
    path.write_text(item.model_dump_json(indent=2))
    return item


def _resolve_pending(item_id: str, approver: str) -> None:
    path = _gov_dir("pending") / f"{item_id}.json"
    if path.exists():
        item = PendingCall.model_validate_json(path.read_text())
        item.status, item.approver = "approved", approver
        (_gov_dir("decided") / path.name).write_text(item.model_dump_json(indent=2))
        path.unlink()


def reject_pending(item_id: str, by: str, note: str) -> PendingCall:
    """A human says no to a queued call; it leaves the queue with the reason."""
    if not by.strip() or not note.strip():
        raise ValueError("by and note are required to reject a call: --by NAME --note TEXT (why it is refused)")
    item = get_pending(item_id)
    item.status, item.approver, item.note = "rejected", by, note
    (_gov_dir("decided") / f"{item.id}.json").write_text(item.model_dump_json(indent=2))
    (_gov_dir("pending") / f"{item.id}.json").unlink()
    audit.append("approval", subject="call", tool=item.tool, call_id=item.id, approver=by, decision="rejected", note=note)
    return item


def pending_calls() -> list[PendingCall]:
    return [PendingCall.model_validate_json(p.read_text()) for p in sorted(_gov_dir("pending").glob("*.json"))]


def decided_calls() -> list[PendingCall]:
    return [PendingCall.model_validate_json(p.read_text()) for p in sorted(_gov_dir("decided").glob("*.json"))]


def get_pending(item_id: str) -> PendingCall:
    if not re.fullmatch(r"[0-9a-f]{12}", item_id):
        raise ValueError(f"pending id {item_id!r} is not valid: use the 12-hex-digit id from `trainops approvals`")
    path = _gov_dir("pending") / f"{item_id}.json"
    if not path.exists():
        known = ", ".join(p.id for p in pending_calls()) or "none"
        raise ValueError(f"pending approval {item_id!r} not found; pending ids: {known} (see `trainops approvals`)")
    return PendingCall.model_validate_json(path.read_text())
