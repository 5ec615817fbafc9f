"""The queue of gated calls waiting for a human, and their decisions (rule R-SEC-4).

A call that reaches the gate without a token is queued under an id derived from its content
(tool and input hash), so a pending file edited afterwards no longer matches its id and is
refused, not approved under its old id. Rejecting (signed by an approver) or withdrawing
(by the actor that asked) takes the call off the queue and revokes every token minted for it
before that moment. The files here are a working copy anything in the workspace can edit; who
asked, who said no and which token was spent are read from the hash-chained audit log.

What an approver is shown and what their key signs are one thing, a `SignableCall`: the canonical
bytes of the validated input, with the call's id re-derived from them. Every approval prompt is
rendered from those bytes, and the approval signs their sha256.
"""
from __future__ import annotations

import getpass
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from trainops.tools.catalog import current_registry
from trainops.tools.governance import anchors, audit, signing
from trainops.workspace import home

ID_PATTERN = re.compile(r"[0-9a-f]{12}")


class PendingCall(BaseModel):
    """A gated call that arrived without a token and waits for a human."""
    id: str
    tool: str
    input: dict[str, Any]
    requested_by: str
    requester_user: str | None = Field(None, description="The OS user of an operator who queued the call: "
                                                         "never one of its approvers.")
    time: float
    status: Literal["pending", "approved", "rejected", "corrupt"] = "pending"
    approver: str | None = Field(None, description="Who decided: the approving principals once a token for it "
                                                   "was used, the rejecting principal, or the withdrawing actor.")
    note: str = ""


class RejectPayload(anchors.SignedPayload):
    """What an approver signs to reject a queued call."""
    purpose: Literal["reject_call"] = "reject_call"
    call_id: str
    tool: str
    input_sha256: str
    note: str
    issued_at: float
    audit_head: anchors.AuditHead



class NotQueued(ValueError):
    """No queued file for that id: the call was never queued here, or it was decided since."""
def canonical_input(inp: BaseModel | dict[str, Any]) -> bytes:
    """The bytes an approval's input hash covers: the input's canonical JSON."""
    data = inp.model_dump(mode="json") if isinstance(inp, BaseModel) else inp
    return audit.canonical_json(data).encode("utf-8")


def input_hash(inp: BaseModel | dict[str, Any]) -> str:
    return audit.sha256_hex(canonical_input(inp))


def _id_of(tool: str, input_sha256: str) -> str:
    return audit.sha256_hex(f"{tool}:{input_sha256}")[:12]


def call_id(tool: str, inp: BaseModel | dict[str, Any]) -> str:
    """Stable id of one exact call: the same tool and input always map to the same pending item."""
    return _id_of(tool, input_hash(inp))


def _shown(value: Any) -> str:
    """A value as canonical JSON, ASCII only: control, C1 and bidi characters print as escapes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).replace("\x7f", "\\u007f")


@dataclass(frozen=True)
class SignableCall:
    """One queued call as an approver sees it and signs it: computed once from the canonical bytes
    of its validated input, displayed from them, and signed over their sha256."""
    item: PendingCall
    input_bytes: bytes

    @property
    def input_sha256(self) -> str:
        return audit.sha256_hex(self.input_bytes)

    @property
    def call_id(self) -> str:
        return _id_of(self.item.tool, self.input_sha256)

    @property
    def input(self) -> dict[str, Any]:
        return json.loads(self.input_bytes)

    def lines(self) -> list[str]:
        """The call in full, one field per line (nested values as canonical JSON), nothing cut."""
        fields = [f"    {name if re.fullmatch(r'[A-Za-z_][A-Za-z0-9_]*', name) else _shown(name)} = {_shown(value)}"
                  for name, value in sorted(self.input.items())]
        return [f"  pending id {self.call_id} (re-derived from the bytes signed)", f"  tool {self.item.tool}",
                f"  input sha256 {self.input_sha256}", "  input:", *(fields or ["    (no fields)"]),
                f"  requested by {_shown(self.item.requested_by)}"]


def gov_dir(name: str) -> Path:
    path = home() / "governance" / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def tool_spec(tool: str):
    """The tool's spec in the registry being served (the agent's own tools included), or None."""
    return current_registry().get(tool)


def validated(tool: str, inp: BaseModel | dict[str, Any]) -> BaseModel:
    """The input as the tool will see it (defaults filled in), so approval and call hash alike."""
    if isinstance(inp, BaseModel):
        return inp
    spec = tool_spec(tool)
    if spec is None:
        raise ValueError(f"no tool named {tool!r}: see `trainops tool list`")
    try:
        return spec.Input.model_validate(inp)
    except ValidationError as exc:
        raise ValueError(_invalid(tool, exc)) from None


def _invalid(tool: str, exc: ValidationError) -> str:
    fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors())
    return f"input is not a valid {tool} input: {fields}"


def _write(path: Path, item: PendingCall) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(item.model_dump_json(indent=2))
    tmp.replace(path)


def round_trip_problem(tool: str, inp: BaseModel, model: type[BaseModel] | None = None) -> str | None:
    """Why `inp`, once queued, could never be approved and run as itself (its JSON does not
    validate as `model`, default the tool's input, or validates to another call), or None. A
    human is never asked to sign such a call."""
    try:
        data = json.loads(canonical_input(inp))
        again = model.model_validate(data) if model is not None else validated(tool, data)
    except ValidationError as exc:
        return _invalid(tool, exc)
    except ValueError as exc:
        return str(exc)
    if input_hash(again) != input_hash(inp):
        return (f"the {tool} input does not read back as itself (validating its JSON gives another input), so an "
                "approval of it could never match the call: fix the input model's validators")
    return None


def record_pending(tool: str, inp: BaseModel, requested_by: str) -> PendingCall:
    """Queue a call (idempotent); a queued file that no longer matches its content is rewritten from the
    real call. A call that could not be approved as itself is refused (ValueError), never queued."""
    problem = round_trip_problem(tool, inp, type(inp))
    if problem:
        raise ValueError(problem)
    item = PendingCall(id=call_id(tool, inp), tool=tool, input=inp.model_dump(mode="json"),
                       requested_by=requested_by, time=time.time(),
                       requester_user=getpass.getuser() if requested_by == "operator" else None)
    path = gov_dir("pending") / f"{item.id}.json"
    try:
        queued = get_pending(item.id)
    except ValueError:
        queued = None
    if queued is None or (queued.requested_by, queued.requester_user) != (item.requested_by, item.requester_user):
        audit.append("queued", call_id=item.id, tool=tool, input_sha256=input_hash(inp),
                     requested_by=item.requested_by, requester_user=item.requester_user)
    if queued is None:
        _write(path, item)
    return queued or item


def _load(path: Path) -> PendingCall:
    try:
        return PendingCall.model_validate_json(path.read_bytes())
    except (ValidationError, ValueError, OSError) as exc:
        return PendingCall(id=path.stem, tool="", input={}, requested_by="", time=0.0, status="corrupt",
                           note=f"{path} cannot be read as a queued call ({type(exc).__name__})")


def get_pending(item_id: str) -> PendingCall:
    """A queued call whose content still derives its id; anything else is a ValueError naming why."""
    return signable(item_id).item


def signable(item_id: str) -> SignableCall:
    """The queued call as it is shown and signed, its id re-derived from its canonical bytes; a
    ValueError naming why when it is not queued (NotQueued), unreadable or edited since."""
    if not isinstance(item_id, str) or not ID_PATTERN.fullmatch(item_id):
        raise ValueError(f"pending id {item_id!r} is not valid: use the 12-hex-digit id from `trainops approvals`")
    path = gov_dir("pending") / f"{item_id}.json"
    if not path.is_file():
        known = ", ".join(p.id for p in pending_calls()) or "none"
        raise NotQueued(f"pending approval {item_id!r} not found; pending ids: {known} (see `trainops approvals`)")
    item = _load(path)
    if item.status == "corrupt":
        raise ValueError(f"{item.note}: nothing to approve; run the call again to queue it afresh")
    call = SignableCall(item, canonical_input(validated(item.tool, item.input))) if item.tool else None
    derived = call.call_id if call else "none"
    if call is None or item.id != item_id or derived != item_id or item.status != "pending":
        raise ValueError(f"pending file {path} was edited after the call was queued (its content derives id "
                         f"{derived}, not {item_id}): it is refused; run the real call again to queue it")
    return call


def resolve(item_id: str, approvers: str) -> None:
    """A token for the call was spent: the call leaves the queue as approved by `approvers`."""
    path = gov_dir("pending") / f"{item_id}.json"
    if path.exists():
        item = _load(path)
        item.status, item.approver = "approved", approvers
        _write(gov_dir("decided") / path.name, item)
        path.unlink(missing_ok=True)


def reject_pending(item_id: str, note: str, key: Path | None = None) -> PendingCall:
    """An approver says no (signed with their key; None: ssh-agent): the call leaves the queue with
    the reason, and every token minted for it so far is revoked. The rejection is an audit anchor."""
    if not note.strip():
        raise ValueError("note is empty: a rejection says why (--note TEXT)")
    item = get_pending(item_id)
    payload = RejectPayload(call_id=item.id, tool=item.tool, input_sha256=input_hash(validated(item.tool, item.input)),
                            note=note, issued_at=time.time(), audit_head=anchors.head())
    signature = signing.sign(payload.signed_bytes(), key)
    signer = signing.verify(payload.signed_bytes(), signature)
    anchors.record(payload.signed_bytes(), signature, signer, subject="call", decision="rejected",
                   tool=item.tool, call_id=item.id, note=note)
    return _close(item, signer.principal, note)


def withdraw(item_id: str, actor: str, note: str) -> PendingCall:
    """The side that asked takes a queued call back (no signature: saying no is always safe);
    tokens minted for it so far are revoked, as on a rejection."""
    if not actor.strip() or not note.strip():
        raise ValueError("actor and note are required to withdraw a call (who takes it back, and why)")
    item = get_pending(item_id)
    audit.append("approval", subject="call", tool=item.tool, call_id=item.id, actor=actor, decision="withdrawn",
                 note=note)
    return _close(item, f"{actor} (withdrawn)", note)


def _close(item: PendingCall, by: str, note: str) -> PendingCall:
    item.status, item.approver, item.note = "rejected", by, note
    _write(gov_dir("decided") / f"{item.id}.json", item)
    (gov_dir("pending") / f"{item.id}.json").unlink(missing_ok=True)
    return item


def history(item_id: str) -> list[dict[str, Any]]:
    """The audit entries about one call: the tamper-evident record of who asked, who said no and
    which token opened it (the queue's files are only its working copy)."""
    return [e for e in audit.read() if e.get("call_id") == item_id]


def requesters(item: PendingCall, entries: list[dict[str, Any]]) -> set[str]:
    """Everyone who asked for the call, lower-cased: the queue file's names and the audit log's."""
    names = {item.requested_by, item.requester_user or ""}
    for entry in entries:
        if entry.get("kind") == "queued":
            names |= {entry.get("requested_by") or "", entry.get("requester_user") or ""}
    return {name.strip().lower() for name in names if name and name.strip()}


def rejected_at(entries: list[dict[str, Any]]) -> float | None:
    """When the call was last rejected or withdrawn: tokens minted up to then are revoked."""
    times = [e["time"] for e in entries if e.get("decision") in ("rejected", "withdrawn")]
    return max(times) if times else None


def pending_calls() -> list[PendingCall]:
    return [_load(p) for p in sorted(gov_dir("pending").glob("*.json"))]


def decided_calls() -> list[PendingCall]:
    return [_load(p) for p in sorted(gov_dir("decided").glob("*.json"))]

