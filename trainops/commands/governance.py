"""Governance commands: `rules`, `approve`, `reject`, `approvals [verify]`, `audit verify|show|repair`.

Wiring only; the logic lives in tools/governance/. An approval or a rejection is signed with
the human's own SSH key (`--key PATH`, else their ssh-agent): who decided is the principal the
allowed-signers file names for that key, never a name typed on the command line. Every string
that comes from a file, a tool or a user is printed with rich markup escaped.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from trainops.output import console, emit, fail, say, table
from trainops.skills.evidence.checks import approval_notes, decide
from trainops.tools.governance import queue, tokens
from trainops.tools.governance.approvals import list_items, verify_pack
from trainops.tools.governance.audit import AuditUnavailable, canonical_json, read, repair
from trainops.tools.governance.tokens import TokenRefused
from trainops.tools.governance.verification import verify

app = typer.Typer()
approvals_app = typer.Typer(help="Pending and decided approvals; `verify PACK` checks a signed decision.")
audit_app = typer.Typer(help="The hash-chained, signature-anchored audit log.", no_args_is_help=True)
app.add_typer(approvals_app, name="approvals")
app.add_typer(audit_app, name="audit")

JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a table.")
KeyOpt = typer.Option(None, "--key", help="Your approver key (private, or .pub with the private half in "
                                          "ssh-agent); default: the first ssh-agent key the allowed-signers "
                                          "file lists.")


def _refusals() -> tuple[type[Exception], ...]:
    """What a refused approval raises: a bad input (ValueError, SigningError) or a token refusal."""
    return (ValueError, TokenRefused)


@app.command("approve")
def approve(
    pack: Optional[str] = typer.Argument(None, help="Evidence pack id to approve."),
    pending: Optional[str] = typer.Option(None, "--pending", help="Approve a queued gated call by its id "
                                                                   "(see `trainops approvals`)."),
    key: Optional[Path] = KeyOpt,
    cosign: Optional[str] = typer.Option(None, "--cosign", help="With --pending: add your signature to another "
                                                                 "approver's token (calls that need two)."),
    ttl_min: float = typer.Option(15.0, "--ttl-min", help="Token lifetime in minutes (at most max_token_ttl_min "
                                                           "of your config's governance table, default 60)."),
    note: str = typer.Option("", "--note", help="Why, or under which conditions (packs)."),
    as_json: bool = JsonOpt,
) -> None:
    """Approve an evidence pack, or sign a single-use token for one queued gated call."""
    if bool(pack) == bool(pending):
        fail("approve needs exactly one of PACK or --pending ID; e.g. `trainops approve --pending ID` "
             "(see `trainops approvals`)", as_json=as_json)
    if pack:
        if cosign:
            fail("--cosign is for --pending calls, not packs", as_json=as_json)
        decide_pack(pack, "approved", note, key, as_json)
        return
    emit(approve_call(pending, key, ttl_min, cosign, as_json), as_json, _show_token)


def approve_call(pending: str, key: Path | None, ttl_min: float, cosign: str | None, as_json: bool) -> dict[str, Any]:
    """Show the queued call in full, then sign exactly those bytes (computed once); the answer says
    whether more approvers must co-sign."""
    try:
        shown = queue.signable(pending)
    except _refusals() as exc:
        fail(str(exc), as_json=as_json)
    if not as_json:
        say(f"approving call {shown.call_id}:")
        for line in tokens.approval_prompt(shown):
            say(line)
    try:
        token = tokens.approve(shown, key, ttl_min=ttl_min, cosign=cosign)
    except _refusals() as exc:
        fail(str(exc), as_json=as_json)
    approvals = tokens.parse(token)
    principals = [signer.principal for signer in tokens.signers(approvals)]
    return {"call_id": shown.call_id, "tool": shown.item.tool, "input": shown.input,
            "input_sha256": shown.input_sha256, "approver": principals[-1], "approvers": principals,
            "approvers_needed": tokens.approvers_needed(shown.item.tool, shown.item.input), "ttl_min": ttl_min,
            "expires_at": min(a.payload.expires_at for a in approvals), "signatures": len(approvals), "token": token}


def _show_token(out: dict[str, Any]) -> None:
    missing = out["approvers_needed"] - out["signatures"]
    say(f"signed call {out['call_id']} ({out['tool']}, input sha256 {out['input_sha256']}): {out['signatures']} "
         f"of {out['approvers_needed']} approver(s), valid {out['ttl_min']:g} min")
    if missing > 0:
        say(f"{missing} more approver(s) must co-sign:\n"
             f"  trainops approve --pending {out['call_id']} --cosign {out['token']}")
    else:
        say(f"run it with\n  trainops tool call {out['tool']} --input {shlex.quote(canonical_json(out['input']))} "
             f"--approval-token {out['token']}")


@app.command("reject")
def reject(
    pack: Optional[str] = typer.Argument(None, help="Evidence pack id to reject."),
    note: str = typer.Option(..., "--note", help="Why it is rejected (required)."),
    pending: Optional[str] = typer.Option(None, "--pending", help="Reject a queued gated call by its id."),
    key: Optional[Path] = KeyOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Reject an evidence pack or a queued gated call, with a reason, signed with your key."""
    if bool(pack) == bool(pending):
        fail("reject needs exactly one of PACK or --pending ID; e.g. `trainops reject --pending ID --note WHY`",
             as_json=as_json)
    if pack:
        decide_pack(pack, "rejected", note, key, as_json)
        return

    try:
        item = queue.reject_pending(pending, note, key)
    except _refusals() as exc:
        fail(str(exc), as_json=as_json)
    emit(item, as_json, lambda i: say(f"rejected call {i.id} ({i.tool}) by {i.approver}: {i.note}; "
                                       "every token minted for it is revoked"))


def decide_pack(pack: str, decision: str, note: str, key: Path | None, as_json: bool) -> None:
    try:
        record = decide(pack, decision, note=note, key=key)
    except _refusals() as exc:
        fail(str(exc), as_json=as_json)
    shown = record.model_dump(mode="json", exclude={"files", "signature"})
    shown["notes"] = approval_notes(pack) if decision == "approved" else []
    emit(shown, as_json, _show_decision)


def _show_decision(shown: dict[str, Any]) -> None:
    say(f"{shown['decision']} {shown['pack']} by {shown.get('by') or shown.get('principal')}; "
        f"signed content {shown['content_hash'][:16]}")
    for note in shown["notes"]:
        say(f"note: {note}")


@approvals_app.callback(invoke_without_command=True)
def approvals(ctx: typer.Context, as_json: bool = JsonOpt) -> None:
    """List pending items (packs without a decision, gated calls waiting) and decided ones; a file
    that cannot be read is listed as corrupt."""
    if ctx.invoked_subcommand:
        return

    emit(list_items(), as_json, _show_approvals)


def _show_approvals(items) -> None:
    """Packs and decided calls in a table; each pending call in full below it, one field per line,
    from the bytes an approval of it signs (a queue file edited since it was queued is refused)."""
    waiting = [i for i in items if i.kind == "call" and i.status == "pending"]
    table("approvals", ["kind", "id", "status", "by", "detail"],
           [[i.kind, i.id, i.status, i.by, i.detail] for i in items if i not in waiting])
    for item in waiting:
        try:
            shown = queue.signable(item.id)
        except ValueError as exc:
            say(f"pending call {item.id}: refused, not approvable: {exc}")
            continue
        say(f"pending call {shown.call_id} (approve with `trainops approve --pending {shown.call_id}`):")
        for line in tokens.approval_prompt(shown):
            say(line)


@approvals_app.command("verify")
def approvals_verify(pack: str = typer.Argument(..., help="Evidence pack id."), as_json: bool = JsonOpt) -> None:
    """Check a pack's signed decision against the allowed signers and that no file changed since; exit 1 when not."""
    try:
        result = verify_pack(pack)
    except ValueError as exc:
        fail(str(exc), as_json=as_json)
    emit(result, as_json, lambda r: console().print(
        f"{'[green]valid[/]' if r.ok else '[red]INVALID[/]'} {escape(r.pack)}: {escape(r.reason)}"
        + (f" ({escape(', '.join(r.changed))})" if r.changed else ""), highlight=False))
    if not result.ok:
        raise typer.Exit(1)


@audit_app.command("verify")
def audit_verify(as_json: bool = JsonOpt) -> None:
    """Walk the hash chain and check every signed anchor; name the first broken line (exit 1)."""
    report = verify()
    emit(report, as_json, lambda r: console().print(
        f"{'[green]intact[/]' if r.ok else '[red]BROKEN[/]'} {escape(r.path)}: {r.entries} entries; {escape(r.reason)}"
        + (f" — first bad line {r.first_bad_line}" if r.first_bad_line else ""), highlight=False))
    if not report.ok:
        raise typer.Exit(1)


@audit_app.command("repair")
def audit_repair(as_json: bool = JsonOpt) -> None:
    """Cut a torn last line (a write cut short) off the log, keep its bytes in a side file, and audit the repair."""
    try:
        entry = repair()
    except (ValueError, AuditUnavailable) as exc:
        fail(str(exc), as_json=as_json)
    emit(entry, as_json, lambda e: say(f"repaired: line {e['torn_line']} ({e['torn_problem']}) moved to "
                                        f"{e['side_file']}; recorded as entry {e['seq']}"))


@audit_app.command("show")
def audit_show(tail: int = typer.Option(20, "--tail", min=1, help="How many recent entries."),
               as_json: bool = JsonOpt) -> None:
    """The most recent audit entries."""
    try:
        entries = read(tail=tail)
    except AuditUnavailable as exc:
        fail(str(exc), as_json=as_json)
    emit(entries, as_json, lambda es: table(
        "audit log", ["seq", "kind", "tool/subject", "decision/ok", "actor/approver"],
        [[e["seq"], e["kind"], e.get("tool") or e.get("pack") or e.get("subject"),
          e.get("decision", e.get("ok")),
          e.get("actor") or e.get("principal") or e.get("approver") or e.get("requested_by")] for e in es]))
