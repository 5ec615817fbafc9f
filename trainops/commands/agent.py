"""`trainops chat`, `trainops ask`, `trainops threads`: the ops agent at the command line.

Wiring only: `trainops.agents.session` does the work; LangGraph and LangChain load inside the commands.
"""
from __future__ import annotations

import getpass
import json
import os
from typing import Any, Optional

import typer
from rich.live import Live
from rich.markup import escape
from rich.prompt import Prompt
from rich.table import Table
from rich.text import Text

from trainops.agents.answer_flag import FLAG_MEANING
from trainops.agents.providers import ProviderError, load_settings
from trainops.output import console, emit, fail
from trainops.terminal_text import shown_name
from trainops.tools.governance.tokens import approval_prompt
from trainops.workspace import is_valid_id

ThreadOpt = typer.Option(None, "--thread", help="Thread id to resume or create (letters, digits, _ . -).")
ProviderOpt = typer.Option(None, "--provider",
                           help="offline (default), openai or anthropic; "
                                "overrides TRAINOPS_PROVIDER and trainops.toml.")
ModelOpt = typer.Option(None, "--model", help="Model name for the provider.")
BaseUrlOpt = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1.")
BUDGET_STOPS = ("step_budget", "token_budget", "bad_tool_calls")


def _approver() -> str:
    return os.environ.get("TRAINOPS_APPROVER") or getpass.getuser()


def _open(thread: str | None, provider: str | None, model: str | None, base_url: str | None, as_json: bool,
          stream_tokens: bool = False):
    from trainops.agents.session import AgentSession

    try:
        return AgentSession(thread, load_settings(provider, model, base_url), stream_tokens=stream_tokens)
    except ProviderError as exc:
        fail(str(exc), as_json=as_json)
    except ValueError as exc:
        fail(f"--thread: {exc}", as_json=as_json)


def _drain(events, show, as_json: bool) -> list[dict[str, Any]]:
    """Run the graph, showing each event as it arrives; provider failures become one clean line."""
    seen = []
    try:
        for event in events:
            seen.append(event)
            show(event)
    except ProviderError as exc:
        fail(str(exc), as_json=as_json)
    except ValueError as exc:
        fail(str(exc), as_json=as_json)
    return seen


def _show(event: dict[str, Any]) -> None:
    out = console()
    kind = event["kind"]
    if kind == "tool_call":
        out.print(f"[cyan]→ {escape(event['tool'])}[/] {escape(json.dumps(event['args'], default=str))}",
                  highlight=False)
    elif kind == "tool_result":
        mark = "[green]✓[/]" if event["status"] == "success" else "[red]✗[/]"
        detail = f"  {event['finding']}" if event.get("finding") else ""
        detail = detail if event["status"] == "success" else f" {(event['output'] or {}).get('error', '')}"
        out.print(f"{mark} {escape(event['tool'] + detail)}", highlight=False)
        if event.get("figures"):  # an SOP step as it lands: its figures, one row each
            table = Table("figure", "value", box=None, padding=(0, 2, 0, 2))
            for name, value in event["figures"]:
                table.add_row(escape(name), escape(value))
            out.print(table)
    elif kind == "approval":  # the call itself is shown only from the queue, checked: _show_request
        out.print(f"[bold yellow]approval needed[/] {escape(str(event['tool']))} (risk {escape(str(event['risk']))})"
                  f" · pending {escape(str(event.get('pending_id')))}", highlight=False)
    elif kind == "answer":
        out.print(event["text"] or "(no answer)", highlight=False, markup=False)


class _ChatView:
    """Shows events as they arrive; model tokens stream into a transient draft line that gives
    way to the checked answer (the report check runs before an answer is final)."""
    def __init__(self) -> None:
        self.live = None
        self.draft = ""

    def __call__(self, event: dict[str, Any]) -> None:
        if event["kind"] == "token":
            if self.live is None:
                self.live = Live(console=console(), transient=True, auto_refresh=False)
                self.live.start()
            self.draft += event["text"]
            self.live.update(Text(self.draft, style="dim"), refresh=True)
            return
        if self.live is not None:
            self.live.stop()
            self.live, self.draft = None, ""
        _show(event)


def _show_request(request) -> None:
    """The approval prompt: rendered from the queued call's canonical bytes (what the key signs),
    one field per line, never cut; a call decided outside the thread can only be rejected."""
    out = console()
    payload = request.payload
    out.print(f"[bold yellow]approval needed[/] {escape(str(payload.get('tool')))} "
              f"(risk {escape(str(payload.get('risk')))})", highlight=False)
    lines = approval_prompt(request.call) if request.call else [
        f"  pending {payload.get('pending_id')} is no longer queued (decided outside this thread): reject to close it"]
    for line in lines:
        out.print(line, markup=False, highlight=False, soft_wrap=True)


def _ask_decision(request, approver: str) -> dict[str, Any]:
    call = request.call
    choices = ["approve", "edit", "reject"] if call else ["reject"]
    choice = Prompt.ask(f"{escape(str(request.payload.get('tool')))}: {', '.join(choices)}?", choices=choices,
                        default="reject")
    if choice == "reject":
        return {"decision": "reject", "approver": approver, "comment": Prompt.ask("reason", default="rejected in chat")}
    if choice == "edit":
        while True:
            text = Prompt.ask("new input as JSON", default=json.dumps(call.input))
            try:
                return {"decision": "edit", "approver": approver, "args": json.loads(text)}
            except json.JSONDecodeError as exc:
                console().print(f"[red]not JSON ({escape(str(exc))}); try again[/]")
    return {"decision": "approve", "approver": approver, "tool": call.item.tool, "pending_id": call.call_id,
            "input_sha256": call.input_sha256}


app = typer.Typer()


@app.command()
def chat(
    thread: Optional[str] = ThreadOpt,
    provider: Optional[str] = ProviderOpt,
    model: Optional[str] = ModelOpt,
    base_url: Optional[str] = BaseUrlOpt,
    approver: Optional[str] = typer.Option(None, "--approver",
                                           help="Name recorded on approvals "
                                                "(default $TRAINOPS_APPROVER or your login)."),
) -> None:
    """Talk to the ops agent; the thread persists, gated actions ask you inline. /exit leaves."""
    who = approver or _approver()
    with _open(thread, provider, model, base_url, False, stream_tokens=True) as session:
        view = _ChatView()
        console().print(f"[dim]thread {escape(session.thread_id)} · provider {session.settings.provider} · /exit to "
                        f"leave[/]")
        while True:
            try:  # leaving at any prompt keeps an undecided approval pending in the thread
                for request in session.approval_requests():
                    _show_request(request)
                    _drain(session.decide(_ask_decision(request, who)), view, False)
                text = Prompt.ask("[bold]you[/]").strip()
            except (EOFError, KeyboardInterrupt):
                break
            except ValueError as exc:  # the paused call is not the queued one: nothing shown or signed
                fail(str(exc))
            if text in ("/exit", "/quit"):
                break
            if text:
                _drain(session.ask(text), view, False)


@app.command()
def ask(
    question: str = typer.Argument(..., help="What you want, in words."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    thread: Optional[str] = ThreadOpt,
    provider: Optional[str] = ProviderOpt,
    model: Optional[str] = ModelOpt,
    base_url: Optional[str] = BaseUrlOpt,
) -> None:
    """One question, no prompts: a gated action becomes a pending approval instead of running."""
    if not question.strip():
        fail("question is empty: say what you need, e.g. trainops ask \"show pending approvals\"", as_json=as_json)
    with _open(thread, provider, model, base_url, as_json) as session:
        events = _drain(session.ask(question), (lambda e: None) if as_json else _show, as_json)
        pending = session.pending()
        try:  # the queued calls, checked, as chat would show them: what a later approval signs
            shown = [] if as_json or not pending else session.approval_requests()
        except ValueError as exc:
            fail(str(exc), as_json=as_json)
        result = {
            "thread_id": session.thread_id,
            "provider": session.settings.provider,
            "answer": next((e["text"] for e in events if e["kind"] == "answer"), None),
            "final_answer": session.final_answer(),
            "stop_reason": session.stop_reason(),
            "answer_flag": session.answer_flag(),
            "tool_calls": [{"tool": e["tool"], "status": e["status"]} for e in events if e["kind"] == "tool_result"],
            "pending_approvals": pending,
            "resume": f"trainops chat --thread {session.thread_id}" if pending else None,
            "timing": session.timing,
        }
    if as_json:
        emit(result, True)
    elif result["answer_flag"]:
        console().print(f"[red]not an answer to rely on: {FLAG_MEANING[result['answer_flag']]}[/]")
    elif pending:
        for request in shown:
            for line in approval_prompt(request.call) if request.call else []:
                console().print(line, markup=False, highlight=False, soft_wrap=True)
        console().print(f"[yellow]{len(pending)} action(s) wait for approval; decide with "
                        f"`{escape(result['resume'])}`[/]")
    if result["answer_flag"] or result["stop_reason"] in BUDGET_STOPS:
        raise typer.Exit(1)  # no answer a script can rely on: empty, free text, cut off, or a budget spent


@app.command()
def threads(as_json: bool = typer.Option(False, "--json", help="Print the threads as JSON.")) -> None:
    """List the ops agent's conversation threads, newest first."""
    from trainops.agents.threads import list_threads

    def render(items) -> None:
        table = Table("thread", "updated", "messages", "pending", "first request")
        for item in items:  # a thread id written into agent.sqlite by hand is shown escaped and marked
            table.add_row(escape(shown_name(item.thread_id, is_valid_id(item.thread_id))), escape(item.updated[:19]),
                          str(item.messages), str(item.pending_approvals), escape(item.first_request))
        console().print(table if items else "no threads yet: start one with `trainops chat` or `trainops ask`")

    emit(list_threads(), as_json, render)
