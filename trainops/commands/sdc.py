"""`trainops sdc-check`: the periodic fleet known-answer check (issue 42 item 5, K-FM-5). Each round is
a check job through the scheduler on every usable node (skills/sdc.fleet_round); a node that fails is
drained where a good one remains and handed to a human (R-ESC-3). The interval is kept by this
process between rounds (run it under a service manager for a standing check), set by --every-min or
`[sdc] interval_min` in the settings files."""
from __future__ import annotations

import time
from typing import Any

import typer
from rich.markup import escape

from trainops.output import console, emit, fail
from trainops.settings import SettingsError, table
from trainops.skills.sdc import FleetRound, fleet_round
from trainops.tools.base import ToolError

app = typer.Typer()
DEFAULT_INTERVAL_MIN = 1440.0
"""A day: the fleet check costs every node a few seconds of GEMM and one collective."""
MIN_INTERVAL_MIN, MAX_INTERVAL_MIN = 0.01, 7 * 1440.0
"""Bounds on an interval from a flag or a settings file: a check at most every 0.6 s, at least weekly."""
MAX_ROUNDS = 100_000


def interval_min(flag: float | None) -> tuple[float, str]:
    """(minutes between rounds, where that came from): the flag, else `[sdc] interval_min`, else a day;
    a value outside the bounds is refused, naming where it was set."""
    if flag is not None:
        value, source = flag, "--every-min"
    else:
        values, sources = table("sdc")
        value, source = values.get("interval_min", DEFAULT_INTERVAL_MIN), sources.get("interval_min", "the default")
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not MIN_INTERVAL_MIN <= value <= MAX_INTERVAL_MIN:
        raise SettingsError(f"{source}: interval {value!r} is not a number of minutes from {MIN_INTERVAL_MIN} to "
                            f"{MAX_INTERVAL_MIN:g}; set e.g. interval_min = 1440 (daily)")
    return float(value), source


def _line(r: FleetRound) -> str:
    return r.check.line() + (f"; handed to a human: {r.handed_to_human}" if r.handed_to_human else "")


def _render(result: dict[str, Any]) -> None:
    out = console()
    out.print(f"fleet check every {result['interval_min']:g} min ({escape(result['interval_source'])})",
              highlight=False)
    for r in result["rounds"]:
        out.print(_line(FleetRound.model_validate(r)), highlight=False, markup=False)


@app.command("sdc-check")
def sdc_check(
    scheduler: str = typer.Option("local", "--scheduler", help="local | slurm | kubernetes."),
    every_min: float | None = typer.Option(None, "--every-min", help="Minutes between rounds (default: [sdc] "
                                                                     "interval_min, else 1440)."),
    rounds: int = typer.Option(1, "--rounds", min=1, max=MAX_ROUNDS, help="Rounds to run, then stop."),
    timeout_s: float = typer.Option(300.0, "--timeout", min=1, max=86400, help="Seconds one check job may take."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The fleet known-answer SDC check through the scheduler, every --every-min (or [sdc] interval_min)
    minutes; a failing node is drained and handed to a human."""
    try:
        every, source = interval_min(every_min)
        done: list[FleetRound] = []
        for k in range(rounds):
            if k:
                time.sleep(max(0.0, done[-1].started_at + every * 60 - time.time()))
            done.append(fleet_round(scheduler, timeout_s=timeout_s))
    except (SettingsError, ToolError) as exc:
        fail(str(exc), as_json=as_json)
    emit({"interval_min": every, "interval_source": source, "rounds": [r.model_dump(mode="json") for r in done],
          "handed_to_human": [r.handed_to_human for r in done if r.handed_to_human]}, as_json, _render)
    if any(r.handed_to_human for r in done):
        raise typer.Exit(3)
