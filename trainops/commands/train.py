"""`trainops train`: run (or, with --dry-run, plan) a training job on this machine."""
from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer

from trainops.output import console, emit, fail


def _render_result(result: Any) -> None:
    from rich.markup import escape

    out = console()
    colour = "green" if result.status == "ok" else "red"
    mfu = f"{result.mfu_pct:.2f}% ({result.peak_source})" if result.mfu_pct is not None else "n/a"
    loss = f"{result.final_loss:.4f}" if result.final_loss is not None else "n/a"
    out.print(f"[bold {colour}]{result.status}[/]  steps {result.steps_completed}  final loss {loss}  "
              f"mean MFU {mfu}  exit code {result.exit_code}")
    if result.failure:
        out.print(f"[red]{escape(result.failure)}[/]", highlight=False)
    out.print(f"run folder: {result.run_dir}", highlight=False)


def _render_plan(plan: Any) -> None:
    from rich.table import Table

    layout = plan.layout
    table = Table(title=f"dry run: mesh {dict(zip(plan.mesh_dim_names, plan.mesh_shape))}, "
                        f"{plan.n_microbatches} micro-batches per step")
    for name in ("rank", "coords", "layers", "params", "param GiB", "grad GiB", "optimizer GiB",
                 "activation GiB", "total GiB"):
        table.add_column(name)
    for rank in plan.ranks:
        table.add_row(str(rank.rank), " ".join(f"{k}={v}" for k, v in rank.coords.items() if v),
                      f"{rank.layers[0]}-{rank.layers[-1]}" if rank.layers else "-", f"{rank.params:,}",
                      *(f"{b / 2**30:.3f}" for b in (rank.param_bytes, rank.grad_bytes,
                                                      rank.optimizer_bytes, rank.activation_bytes,
                                                      rank.total_bytes)))
    console().print(table)
    console().print(f"world size {layout.world_size}; largest rank total {plan.max_total_bytes / 2**30:.2f} GiB "
                    "(estimates, formulas in --json)")


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        config: Optional[Path] = typer.Argument(None, help="Job config TOML (see trainer/config.py)."),
        preset: Optional[str] = typer.Option(None, "--preset", help="Model preset: tiny, small, llama3-1b, llama3-8b, llama3-70b."),
        nproc: int = typer.Option(1, "--nproc", help="Processes (ranks) on this machine."),
        overrides: List[str] = typer.Option([], "--set", help="Override: section.key=value (repeatable)."),
        run_id: Optional[str] = typer.Option(None, "--run-id", help="Run folder name under $TRAINOPS_HOME/runs."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Validate the layout and plan memory per rank; launch nothing."),
        as_json: bool = typer.Option(False, "--json", help="Print a JSON summary for machines."),
    ) -> None:
        """Train with torchrun here (gloo on CPU, NCCL on GPU): per-step MFU lines, the run folder, non-zero exit on failure."""
        if nproc < 1:
            fail(f"--nproc {nproc} is not valid: use 1 or more processes", as_json=as_json)
        from trainops.trainer.config import ConfigError, load_config
        from trainops.trainer.layout import LayoutError, plan_dry_run, validate_layout

        try:
            cfg = load_config(config, preset, overrides)
            if dry_run:
                emit(plan_dry_run(cfg, nproc), as_json, _render_plan)
                return
            validate_layout(cfg, nproc)
        except (ConfigError, LayoutError) as error:
            fail(str(error), as_json=as_json)
        from trainops.trainer.launch import run_local

        try:
            result = run_local(cfg, nproc, run_id=run_id, show_progress=not as_json)
        except ValueError as error:  # a bad or taken run id
            fail(str(error), as_json=as_json)
        emit(result, as_json, _render_result)
        if result.status != "ok":
            raise typer.Exit(1)
