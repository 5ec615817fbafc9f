"""`trainops interruptions` and `trainops ettr`: the interruption record and the effective training
time it gives, through the read-only list_interruptions and effective_training_time tools."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from trainops.output import console, emit, fail
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke, validating
from trainops.tools.reliability import ettr as ettr_tool
from trainops.tools.reliability import interruptions as interruptions_tool
from trainops.workspace import confine, home

app = typer.Typer()
MAX_WINDOW_S = 30 * 86400.0


def _render_interruptions(result: dict[str, Any]) -> None:
    out = console()
    rows = result["interruptions"]
    if not rows:
        out.print("no interruptions recorded", highlight=False)
    for r in rows:
        flags = "".join(f" [{f}]" for f in ("planned", "drill") if r[f])
        out.print(f"{r['id']} {r['name']}: {r['cause']}{flags}, lost {r['time_lost_s']:.1f} s / "
                  f"{r['steps_lost']} step(s): {r['cause_reason']}", highlight=False, markup=False)
    out.print("causes: " + ", ".join(f"{k} {v}" for k, v in result["cause_distribution"].items()), highlight=False)


@app.command("interruptions")
def interruptions(
    job_id: str | None = typer.Option(None, "--job", help="Only this job's records."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """List the interruption record: each job end that was not a clean finish, its cause and evidence."""
    try:
        with validating(interruptions_tool.list_interruptions):
            inp = interruptions_tool.InterruptionsInput(job_id=job_id)
        out = invoke(interruptions_tool.list_interruptions, inp)
    except ToolError as exc:
        fail(str(exc), as_json=as_json)
    emit(out.model_dump(mode="json"), as_json, _render_interruptions)


def _render_ettr(result: dict[str, Any]) -> None:
    out = console()
    for w in result["windows"]:
        out.print(f"{w['start']:.0f}-{w['end']:.0f}: ETTR {w['ettr_pct']:.1f}% "
                  f"({w['productive_s']:.1f} of {w['wall_s']:.1f} s)", highlight=False)
    if not result["windows"]:
        out.print("no unplanned interruptions recorded: no ETTR series yet", highlight=False)
    if result["windows_left_out"]:
        out.print(f"{result['windows_left_out']:,} older windows left out: the series shows the newest "
                  f"{len(result['windows']):,}; pass a wider --window to see the whole record", highlight=False)
    rel = result["reliability"]
    rate = rel["interruption_rate_per_day"]
    out.print(f"interruptions {rel['unplanned']} unplanned of {rel['interruptions']}; rate "
              f"{'n/a' if rate is None else f'{rate:g}/day'}; MTBF {rel['mtbf_h']:.3g} h ({rel['mtbf_source']}); "
              f"recovery {rel['recovery_time_s'] if rel['recovery_time_s'] is not None else 'n/a'} s",
              highlight=False, markup=False)
    if result.get("plot"):
        out.print(f"plot: {result['plot']}", highlight=False, markup=False)


def plot_ettr(windows: list[dict[str, Any]], path: Path) -> Path:
    """ETTR per window as a PNG (matplotlib loaded here only; mathtext off)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context({"text.parse_math": False}):
        fig, ax = plt.subplots(figsize=(6, 3))
        t0 = windows[0]["start"] if windows else 0.0
        ax.plot([(w["end"] - t0) / 3600 for w in windows], [w["ettr_pct"] for w in windows], marker="o")
        ax.set(xlabel="hours since first recorded job", ylabel="ETTR %", ylim=(0, 105),
               title="Effective training time per window")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return path


@app.command("ettr")
def ettr(
    window_s: float = typer.Option(3600.0, "--window", help="Window width in seconds."),
    job_id: str | None = typer.Option(None, "--job", help="Only this job."),
    mtbf_h: float | None = typer.Option(None, "--mtbf-h", help="Declared MTBF (h), used while the record is too "
                                                                "short (default: an assumed 24 h, labelled so)."),
    plot: Path | None = typer.Option(None, "--plot", help="PNG path (default: WORKSPACE/ettr.png)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Effective training time per window from the interruption record, with MTBF and recovery time."""
    if not ettr_tool.MIN_WINDOW_S <= window_s <= MAX_WINDOW_S:  # nan fails this too
        fail(f"--window {window_s:g}: one window must be a positive number of seconds, at least "
             f"{ettr_tool.MIN_WINDOW_S:g} and at most {MAX_WINDOW_S:.0f} (30 days); e.g. --window 3600 for hourly "
             "readings", as_json=as_json)
    try:
        with validating(ettr_tool.effective_training_time):
            inp = ettr_tool.EttrInput(job_id=job_id, window_s=window_s, declared_mtbf_h=mtbf_h)
        out = invoke(ettr_tool.effective_training_time, inp)
        target = confine(plot, "--plot") if plot else home() / "ettr.png"
    except (ToolError, ValueError) as exc:
        fail(str(exc), as_json=as_json)
    result = out.model_dump(mode="json")
    result["plot"] = str(plot_ettr(result["windows"], target)) if result["windows"] else None
    emit(result, as_json, _render_ettr)
