"""`trainops bench`: the performance suite (benchmarks/suite.py), results in benchmarks/RESULTS.md."""
from __future__ import annotations

import typer
from rich.table import Table

from trainops.benchmarks import suite
from trainops.benchmarks.harness import results_path
from trainops.output import console, emit, fail
from trainops.tools.base import ToolError

app = typer.Typer()


@app.command("bench")
def bench(
    quick: bool = typer.Option(False, "--quick", help="fewer repeats: a smoke run, not figures to publish"),
    as_json: bool = typer.Option(False, "--json", help="print the figures as JSON"),
) -> None:
    """Run the performance suite and rewrite benchmarks/RESULTS.md (side-by-side ratios)."""
    try:
        result = suite.run(quick=quick)
    except (RuntimeError, ToolError) as error:
        fail(f"benchmark failed: {error}", as_json=as_json)
    figures = [{"name": f.name, "median": f.median, "unit": f.unit, "samples": f.samples, "target": f.target,
                "met": f.passed, "note": f.note} for f in result.figures]
    emit({"results": str(results_path()), "figures": figures}, as_json, _render)


def _render(payload: dict) -> None:
    table = Table(title=f"benchmarks -> {payload['results']}")
    for column in ("figure", "median", "target", "met"):
        table.add_column(column)
    for fig in payload["figures"]:
        met = {True: "[green]yes[/]", False: "[red]no[/]", None: "n/a"}[fig["met"]]
        table.add_row(fig["name"], f"{fig['median']:.4g} {fig['unit']}", fig["target"], met)
    console().print(table)
