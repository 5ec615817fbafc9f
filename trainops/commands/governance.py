"""Governance commands: `rules`, `approve`, `reject`, `approvals [verify]`, `audit verify|show`.
Wiring only; the logic lives in tools/governance/."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from trainops.output import console, emit, fail

JsonOpt = typer.Option(False, "--json", help="Print JSON instead of a table.")


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    console().print(table)


def register(app: typer.Typer) -> None:
    @app.command("rules")
    def rules(as_json: bool = JsonOpt) -> None:
        """List every AGENTS.md rule ID and the code that enforces it."""
        from trainops.tools.governance.rules import list_rules

        emit(list_rules(), as_json, lambda rs: _table(
            "AGENTS.md rules", ["id", "title", "enforcement", "where"],
            [[r.id, r.title, r.enforcement, r.where] for r in rs]))

    @app.command("approve")
    def approve(
        pack: Optional[str] = typer.Argument(None, help="Evidence pack id (or folder) to approve."),
        by: str = typer.Option(..., "--by", help="Name of the approving human."),
        note: str = typer.Option("", "--note", help="Why, or under which conditions."),
        call: Optional[str] = typer.Option(None, "--call", help="Approve one gated tool call: the tool name."),
        input_json: Optional[str] = typer.Option(None, "--input", help="With --call: the exact tool input as JSON."),
        pending: Optional[str] = typer.Option(None, "--pending", help="Approve a pending gated call by its id."),
        ttl_min: float = typer.Option(15.0, "--ttl-min", help="Token lifetime in minutes (gated calls)."),
        as_json: bool = JsonOpt,
    ) -> None:
        """Approve an evidence pack (signed decision), or mint a single-use token for one gated call."""
        chosen = [name for name, v in (("PACK", pack), ("--call", call), ("--pending", pending)) if v]
        if len(chosen) != 1:
            fail(f"approve needs exactly one of PACK, --call or --pending (got {chosen or 'none'}); "
                 "e.g. `trainops approve PACK --by NAME`", as_json=as_json)
        if pack:
            _decide(pack, "approved", by, note, as_json)
            return
        from trainops.tools.governance import tokens

        try:
            if pending:
                item = tokens.get_pending(pending)
                tool_name, payload = item.tool, item.input
            else:
                tool_name, payload = call, _parse_input(input_json, as_json)
            _refuse_what_the_gate_would(tool_name, payload, by)
            token = tokens.issue_token(tool_name, payload, by, ttl_s=ttl_min * 60)
        except ValueError as exc:
            fail(str(exc), as_json=as_json)
        out = {"tool": tool_name, "input": payload, "approver": by, "ttl_min": ttl_min, "token": token}
        emit(out, as_json, lambda o: console().print(
            f"approved one call of [bold]{o['tool']}[/] for {o['ttl_min']:g} min; run it with\n"
            f"  trainops tool call {o['tool']} --input '{json.dumps(o['input'])}' --approval-token {o['token']}",
            highlight=False, soft_wrap=True))

    @app.command("reject")
    def reject(
        pack: Optional[str] = typer.Argument(None, help="Evidence pack id (or folder) to reject."),
        by: str = typer.Option(..., "--by", help="Name of the rejecting human."),
        note: str = typer.Option(..., "--note", help="Why it is rejected (required)."),
        pending: Optional[str] = typer.Option(None, "--pending", help="Reject a pending gated call by its id."),
        as_json: bool = JsonOpt,
    ) -> None:
        """Reject an evidence pack (signed decision) or a pending gated call, with a reason."""
        if bool(pack) == bool(pending):
            fail("reject needs exactly one of PACK or --pending ID; e.g. `trainops reject PACK --by NAME --note WHY`",
                 as_json=as_json)
        if pack:
            _decide(pack, "rejected", by, note, as_json)
            return
        from trainops.tools.governance import tokens

        try:
            item = tokens.reject_pending(pending, by, note)
        except ValueError as exc:
            fail(str(exc), as_json=as_json)
        emit(item, as_json, lambda i: console().print(f"rejected call {i.id} ({i.tool}) by {i.approver}: {i.note}",
                                                       highlight=False))

    approvals_app = typer.Typer(help="Pending and decided approvals; `verify PACK` checks a signed decision.")
    app.add_typer(approvals_app, name="approvals")

    @approvals_app.callback(invoke_without_command=True)
    def approvals(ctx: typer.Context, as_json: bool = JsonOpt) -> None:
        """List pending items (packs without a decision, gated calls waiting) and decided ones."""
        if ctx.invoked_subcommand:
            return
        from trainops.tools.governance.approvals import list_items

        emit(list_items(), as_json, lambda items: _table(
            "approvals", ["kind", "id", "status", "by", "detail"],
            [[i.kind, i.id, i.status, i.by, i.detail] for i in items]))

    @approvals_app.command("verify")
    def approvals_verify(
        pack: str = typer.Argument(..., help="Evidence pack id (or folder)."),
        public_key: Optional[Path] = typer.Option(None, "--public-key", help="PEM public key (default: the workspace key)."),
        as_json: bool = JsonOpt,
    ) -> None:
        """Check a pack's signed decision and that no file changed since; exit 1 when it does not hold."""
        from trainops.tools.governance.approvals import verify_pack

        if public_key is not None and not public_key.is_file():
            fail(f"--public-key {str(public_key)!r} is not a file: pass the approver's PEM public key", as_json=as_json)
        try:
            result = verify_pack(pack, public_key.read_text() if public_key else None)
        except ValueError as exc:
            fail(str(exc), as_json=as_json)
        emit(result, as_json, lambda r: console().print(
            f"{'[green]valid[/]' if r.ok else '[red]INVALID[/]'} {r.pack}: {r.reason}"
            + (f" ({', '.join(r.changed)})" if r.changed else ""), highlight=False))
        if not result.ok:
            raise typer.Exit(1)

    audit_app = typer.Typer(help="The hash-chained audit log.", no_args_is_help=True)
    app.add_typer(audit_app, name="audit")

    @audit_app.command("verify")
    def audit_verify(as_json: bool = JsonOpt) -> None:
        """Walk the hash chain; name the first edited, deleted, inserted or reordered line (exit 1)."""
        from trainops.tools.governance.audit import verify

        report = verify()
        emit(report, as_json, lambda r: console().print(
            f"{'[green]intact[/]' if r.ok else '[red]BROKEN[/]'} {r.path}: {r.entries} entries; {r.reason}"
            + (f" — first bad line {r.first_bad_line}" if r.first_bad_line else ""), highlight=False))
        if not report.ok:
            raise typer.Exit(1)

    @audit_app.command("repair")
    def audit_repair(as_json: bool = JsonOpt) -> None:
        """Cut a torn last line (a write cut short) off the log, keep its bytes in a side file, and audit the repair."""
        from trainops.tools.governance.audit import AuditUnavailable, repair

        try:
            entry = repair()
        except (ValueError, AuditUnavailable) as exc:
            fail(str(exc), as_json=as_json)
        emit(entry, as_json, lambda e: console().print(
            f"repaired: line {e['torn_line']} ({e['torn_problem']}) moved to {e['side_file']}; "
            f"recorded as entry {e['seq']}", highlight=False, markup=False))

    @audit_app.command("show")
    def audit_show(tail: int = typer.Option(20, "--tail", min=1, help="How many recent entries."),
                   as_json: bool = JsonOpt) -> None:
        """The most recent audit entries."""
        from trainops.tools.governance.audit import AuditUnavailable, read

        try:
            entries = read(tail=tail)
        except AuditUnavailable as exc:
            fail(str(exc), as_json=as_json)
        emit(entries, as_json, lambda es: _table(
            "audit log", ["seq", "kind", "tool/subject", "decision/ok", "actor/approver"],
            [[e["seq"], e["kind"], e.get("tool") or e.get("pack") or e.get("subject"),
              e.get("decision", e.get("ok")), e.get("actor") or e.get("approver")] for e in es]))


def _parse_input(text: Optional[str], as_json: bool) -> dict[str, Any]:
    if text is None:
        fail("--call needs --input JSON: the exact input the tool will be called with", as_json=as_json)
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"--input is not valid JSON ({exc.msg} at column {exc.colno}): pass an object like '{{\"tenant\": \"a\"}}'",
             as_json=as_json)
    if not isinstance(payload, dict):
        fail(f"--input is {type(payload).__name__}, not an object: pass a JSON object", as_json=as_json)
    return payload


def _refuse_what_the_gate_would(tool_name: str, payload: dict[str, Any], by: str) -> None:
    """No token for a call the gate refuses anyway (forbidden, outside the tenant's root, ...)."""
    from trainops.tools.base import CallContext, ToolError, get
    from trainops.tools.governance.gate import GateRefused, check_input

    try:
        spec = get(tool_name)
        check_input(spec, spec.Input.model_validate(payload), CallContext(actor=by))
    except GateRefused as exc:
        raise ValueError(f"no token minted: {exc}") from None
    except (ToolError, ValueError):
        return  # issue_token explains unknown tools and invalid inputs field by field


def _decide(pack: str, decision: str, by: str, note: str, as_json: bool) -> None:
    from trainops.tools.governance.approvals import decide

    try:
        record = decide(pack, decision, by, note)
    except ValueError as exc:
        fail(str(exc), as_json=as_json)
    emit(record.model_dump(exclude={"files", "public_key_pem"}), as_json, lambda r: console().print(
        f"{r['decision']} {r['pack']} by {r['by']}; signed content {r['content_hash'][:16]}", highlight=False))
