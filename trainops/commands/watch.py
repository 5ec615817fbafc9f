"""`trainops watch JOB`: R-ESC-1..4 evaluated on a running job (the `watch_job` tool) until it ends
or a rule fires; a fired rule goes to a human as a pending approval, and a suspected silent data
corruption sets off the SDC response (skills/sdc.py)."""
from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape

from trainops.output import console, emit, fail
from trainops.skills.sdc import act_on_watch
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke, validating
from trainops.tools.reliability import watch as watch_tool

app = typer.Typer()


def _render(result: dict[str, Any]) -> None:
    out = console()
    watched = result["watch"]
    out.print(f"job {watched['job_id']}: {watched['state']}" + (f" ({watched['reason']})" if watched["reason"] else "")
              + f" after {watched['polls']} poll(s)", highlight=False, markup=False)  # the job's own words: inert
    for line in result["handed_to_human"]:
        out.print(f"[bold red]escalated[/] {escape(line)}", highlight=False)
    if not result["handed_to_human"]:
        out.print("no escalation rule fired", highlight=False)


@app.command("watch")
def watch(
    job_id: str = typer.Argument(..., help="The job to watch (the id `trainops train`/submit_job returned)."),
    scheduler: str = typer.Option("local", "--scheduler", help="local | slurm | kubernetes."),
    interval_s: float = typer.Option(1.0, "--interval", help="Seconds between polls."),
    timeout_s: float = typer.Option(3600.0, "--timeout", help="Stop watching after this many seconds."),
    window_s: float = typer.Option(3600.0, "--ettr-window", help="Effective-training-time window, seconds."),
    mtbf_h: float | None = typer.Option(None, "--mtbf-h", help="Declared MTBF (h) while the interruption record is "
                                                                "short (default: an assumed 24 h, labelled so)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Watch a running job and escalate what R-ESC-1..4 say a human must decide."""
    try:
        with validating(watch_tool.watch_job):
            inp = watch_tool.WatchJobInput(job_id=job_id, scheduler=scheduler, poll_interval_s=interval_s,
                                           timeout_s=timeout_s, ettr_window_s=window_s, mtbf_h=mtbf_h)
        watched = invoke(watch_tool.watch_job, inp)
        lines = act_on_watch(watched, scheduler)
    except ToolError as exc:
        fail(str(exc), as_json=as_json)
    emit({"watch": watched.model_dump(mode="json"), "handed_to_human": lines}, as_json, _render)
    if lines:
        raise typer.Exit(3)
