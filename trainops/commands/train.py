"""`trainops train` (run, resume or, with --dry-run, plan a training job) and `trainops export`
(a run's checkpoint as a Hugging Face folder).

A launch goes through the `submit_job` tool on the local scheduler, as the operator, so it
passes the governance gate and lands in the audit log like any other job; the command then
follows the job (trainops.tools.jobs.follow, as the skills and benchmarks do): the trainer's per-step
lines, a progress bar, the run's summary and exit code.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, List, Optional

import typer
from rich.markup import escape
from rich.table import Table

from trainops.output import console, emit, fail
from trainops.run_folder import RunFiles
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke
from trainops.tools.context import CallContext
from trainops.tools.jobs import jobs as job_tools
from trainops.tools.jobs.follow import launch_run
from trainops.trainer.checkpoint_files import step_dir_name, verify_checkpoint
from trainops.trainer.config import ConfigError, load_config
from trainops.trainer.launch import newest_verified_checkpoint, prepare_resume, prepare_run, resolve_run
from trainops.trainer.layout import LayoutError, plan_dry_run, validate_layout

app = typer.Typer()


def _render_result(result: Any) -> None:
    out = console()
    colour = "green" if result.status == "ok" else "red"
    mfu = f"{result.mfu_pct:.2f}% ({result.peak_source})" if result.mfu_pct is not None else "n/a"
    loss = f"{result.final_loss:.4f}" if result.final_loss is not None else "n/a"
    out.print(f"[bold {colour}]{result.status}[/]  steps {result.steps_completed}  final loss {loss}  "
              f"mean MFU {mfu}  exit code {result.exit_code}")
    if result.resumed_from:
        out.print(f"continued from checkpoint {escape(result.resumed_from)}", highlight=False)
    if result.failure:
        out.print(f"[red]{escape(result.failure)}[/]", highlight=False)
    out.print(f"run folder: {result.run_dir}", highlight=False)


def _render_plan(plan: Any) -> None:
    layout = plan.layout
    table = Table(title=f"dry run: mesh {dict(zip(plan.mesh_dim_names, plan.mesh_shape, strict=True))}, "
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


def refuse_if_running(run_dir: Path) -> None:
    """A resume must not start a second job writing into a run folder a live job still trains in."""
    jobs = invoke(job_tools.list_jobs, job_tools.SchedulerRef(scheduler="local"), CallContext(actor="operator")).jobs
    live = [job.job_id for job in jobs if job.run_dir == str(run_dir) and job.state in ("pending", "running")]
    if live:
        raise ValueError(f"run {run_dir.name} is still training in job {live[0]}: wait for it, or stop it with "
                         f"`trainops tool call cancel_job --input '{{\"job_id\": \"{live[0]}\"}}'`, then resume")


@app.command("train")
def train(
    config: Optional[Path] = typer.Argument(None, help="Job config TOML (see trainer/config.py)."),
    preset: Optional[str] = typer.Option(None, "--preset",
                                         help="Model preset: tiny, small, llama3-1b, llama3-8b, llama3-70b."),
    nproc: Optional[int] = typer.Option(None, "--nproc", help="Processes (ranks) on this machine (default 1; "
                                        "with --resume, as many as saved the checkpoint)."),
    overrides: List[str] = typer.Option([], "--set", help="Override: section.key=value (repeatable)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Run folder name under $TRAINOPS_HOME/runs."),
    init_from: Optional[Path] = typer.Option(None, "--init-from", help="Start from a Hugging Face Llama folder "
                                             "(config.json + safetensors); its config gives the model shape."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Continue this run (id or folder) from its newest "
                                         "verified checkpoint, with its own config."),
    dry_run: bool = typer.Option(False, "--dry-run",
                                 help="Validate the layout and plan memory per rank; launch nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary for machines."),
) -> None:
    """Train with torchrun here (gloo on CPU, NCCL on GPU), launched through the governance gate:
    per-step MFU lines, the run folder, non-zero exit on failure."""
    if nproc is not None and nproc < 1:
        fail(f"--nproc {nproc} is not valid: use 1 or more processes", as_json=as_json)
    if resume and (config or preset or run_id or init_from):
        fail("--resume RUN continues that run with its own config: drop CONFIG, --preset, --run-id and --init-from "
             "(change settings with --set)", as_json=as_json)
    if init_from and preset:
        fail("--init-from takes the model shape from the checkpoint's config.json: drop --preset", as_json=as_json)

    try:
        if resume:
            if not dry_run:
                refuse_if_running(resolve_run(resume))
            plan = prepare_resume(resume, overrides, nproc, write=not dry_run)
            run_dir, nproc = Path(plan.run_dir), plan.nproc
            if dry_run:
                emit(plan_dry_run(load_config(RunFiles(run_dir).config, None, overrides), nproc), as_json, _render_plan)
                return
            if not as_json:
                console().print(f"resuming {run_dir.name} from {plan.checkpoint} (step {plan.step}, verified; saved by "
                                f"{plan.saved_world_size} ranks, continuing on {nproc})"
                                + (f"; changed {plan.changed}" if plan.changed else ""), highlight=False, markup=False)
        else:
            if init_from:
                overrides = [*overrides, f"model.init_from={init_from.expanduser().resolve()}"]
            cfg = load_config(config, preset, overrides)
            nproc = nproc or 1
            if dry_run:
                emit(plan_dry_run(cfg, nproc), as_json, _render_plan)
                return
            validate_layout(cfg, nproc)
            run_dir = prepare_run(cfg, run_id=run_id)
    except (ConfigError, LayoutError, ValueError, ToolError) as error:  # a bad run id, a run still training, ...
        fail(str(error), as_json=as_json)

    try:
        result = launch_run(run_dir, nproc, ctx=CallContext(actor="operator"), show_progress=not as_json)
    except ToolError as error:  # refused by the gate, or the scheduler could not start it
        fail(str(error), as_json=as_json)
    emit(result, as_json, _render_result)
    if result.status != "ok":
        raise typer.Exit(1)


@app.command("export")
def export(
    run: str = typer.Argument(..., help="Run id (under $TRAINOPS_HOME/runs) or run folder."),
    to: Path = typer.Option(..., "--to", help="Folder to write the Hugging Face checkpoint into."),
    step: Optional[int] = typer.Option(None, "--step", help="Checkpoint step (default: the newest verified one)."),
    max_shard_bytes: int = typer.Option(5 * 10**9, "--max-shard-bytes", help="Largest safetensors file; more "
                                        "weights than this go into numbered shards with an index."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary for machines."),
) -> None:
    """Write a run's checkpoint (any layout) as a Hugging Face Llama folder: config.json + safetensors."""
    from trainops.trainer.hf import HFFormatError, checkpoint_to_hf

    try:
        run_dir = resolve_run(run)
        cfg = load_config(RunFiles(run_dir).config)
        if step is None:
            newest = newest_verified_checkpoint(run_dir, cfg)
            if newest is None:
                raise ValueError(f"run {run_dir.name} has no verified checkpoint in {run_dir / cfg.checkpoint.folder}")
            checkpoint = newest[0]
        else:
            checkpoint = run_dir / cfg.checkpoint.folder / step_dir_name(step)
            verdict = verify_checkpoint(checkpoint)
            if not verdict.complete:
                raise ValueError(f"{verdict.message}; choose another --step (list them with `trainops tool call "
                                 "list_checkpoints`)")
        folder = checkpoint_to_hf(checkpoint, cfg.model_args(), to, max_shard_bytes=max_shard_bytes)
    except (ConfigError, HFFormatError, ValueError) as error:
        fail(str(error), as_json=as_json)
    files = sorted(p.name for p in folder.iterdir())
    emit({"run_dir": str(run_dir), "checkpoint": str(checkpoint), "folder": str(folder), "files": files}, as_json,
         lambda out: console().print(f"exported {out['checkpoint']} to {out['folder']}: {', '.join(out['files'])}",
                                     highlight=False, markup=False))
