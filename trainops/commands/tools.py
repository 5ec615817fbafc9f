"""`trainops tool list|schema|call`, `trainops env`, `trainops plan checkpoint|ettr|layout`.

Wiring only: every command calls a tool of the one registry the agent also uses
(`trainops.agents.agent_tools.agent_registry`) through the governance gate, as the operator.
Heavy modules (pydantic models, torch) load inside commands.
"""
from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.markup import escape
from rich.table import Table

from trainops.agents.agent_tools import agent_registry
from trainops.output import console, emit, fail
from trainops.settings import SettingsError
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.changes.records import read_change, review_lines
from trainops.tools.context import CallContext
from trainops.tools.governance.gate import needs_approval
from trainops.tools.versions import envelope

JsonOpt = typer.Option(False, "--json", help="Print JSON for machines.")


def run_tool(name: str, payload: dict[str, Any], as_json: bool, approval_token: str | None = None) -> Any:
    """Call a tool as the operator; a ToolError, or a settings file the gate cannot read, becomes one
    clear line and exit code 2."""
    try:
        return call(name, payload, CallContext(actor="operator", approval_token=approval_token),
                    registry=agent_registry())
    except (ToolError, SettingsError) as exc:
        fail(str(exc), as_json=as_json)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)


def render_fields(title: str):
    """A two-column table of a model's top-level fields (nested values as compact JSON)."""
    def render(out: Any) -> None:
        table = Table(title=title, show_header=False)
        table.add_column("field", style="bold")
        table.add_column("value")
        for key, value in (out if isinstance(out, dict) else out.model_dump(mode="json")).items():
            table.add_row(key, escape(_cell(value)))
        console().print(table)

    return render


app = typer.Typer()


tool_app = typer.Typer(help="The typed tools: list them, show their schemas, call one.", no_args_is_help=True)


plan_app = typer.Typer(help="Planning: checkpoint interval, effective training time, parallel layout.",
                       no_args_is_help=True)
app.add_typer(tool_app, name="tool")
app.add_typer(plan_app, name="plan")


@tool_app.command("list")
def tool_list(as_json: bool = JsonOpt) -> None:
    """Every tool with its risk class, who must get a human's approval to call it, and what it does."""
    callers = [CallContext(actor="agent"), CallContext(actor="operator")]
    rows = [
        {"name": s.name, "risk": s.risk, "approval_required": s.approval_required,
         "approval_for": [c.actor for c in callers if needs_approval(s, c)],
         "description": s.description.split(".")[0].replace("\n", " ") + "."}
        for s in agent_registry().values()
    ]

    def render(items: list[dict[str, Any]]) -> None:
        table = Table(title=f"{len(items)} tools")
        for column in ("name", "risk", "approval for", "description"):
            table.add_column(column, overflow="fold")
        for r in items:
            table.add_row(r["name"], r["risk"], ", ".join(r["approval_for"]) or "no", escape(r["description"]))
        console().print(table)

    emit(rows, as_json, render)


@tool_app.command("schema")
def tool_schema(name: str = typer.Argument(..., help="Tool name (see `trainops tool list`)."),
                as_json: bool = JsonOpt) -> None:
    """JSON schema of a tool's input and output."""
    try:
        spec = agent_registry().spec(name)
    except ToolError as exc:
        fail(str(exc), as_json=as_json)
    emit({"name": spec.name, "risk": spec.risk, "approval_required": spec.approval_required,
          "description": spec.description, "input": spec.Input.model_json_schema(),
          "output": spec.Output.model_json_schema()}, True)


@tool_app.command("call")
def tool_call(
    name: str = typer.Argument(..., help="Tool name (see `trainops tool list`)."),
    input_json: str = typer.Option("{}", "--input", help='Input as a JSON object, e.g. \'{"mtbf_h": 24}\'.'),
    approval_token: Optional[str] = typer.Option(None, "--approval-token", help="Signed approval for gated tools."),
    as_json: bool = JsonOpt,
) -> None:
    """Call one tool through the governance gate."""
    if len(input_json) > MAX_INPUT_CHARS:
        fail(f"--input is {len(input_json)} characters, more than {MAX_INPUT_CHARS}: pass the tool's fields only",
             as_json=as_json)
    try:
        payload = json.loads(input_json)
    except json.JSONDecodeError as exc:
        fail(f"--input is not valid JSON ({exc.msg} at column {exc.colno}): "
             "pass a JSON object, e.g. '{\"mtbf_h\": 24}'", as_json=as_json)
    except RecursionError:
        fail(f"--input nests deeper than Python can parse: no tool input nests more than {MAX_INPUT_DEPTH} levels",
             as_json=as_json)
    if (problem := _input_problem(payload)) is not None:
        fail(f"--input {problem}", as_json=as_json)
    if not isinstance(payload, dict):
        fail(f"--input must be a JSON object, got {type(payload).__name__}: wrap the fields in {{...}}",
             as_json=as_json)
    out = run_tool(name, payload, as_json, approval_token)
    emit(envelope(out, payload), as_json, _render_tool(name))


def _render_tool(name: str):
    """A tool's fields; for a change that landed (a change_id), also what a reviewer judges it by."""
    fields = render_fields(name)

    def render(out: dict[str, Any]) -> None:
        fields(out)
        if isinstance(change_id := out.get("change_id"), str):
            for line in review_lines(read_change(change_id)):
                console().print(line, highlight=False, markup=False)

    return render


MAX_INPUT_CHARS = 1 << 20
MAX_INPUT_DEPTH = 32


def _input_problem(value: Any, where: str = "", depth: int = 0) -> str | None:
    """What makes a parsed --input unusable before any tool sees it: nesting past MAX_INPUT_DEPTH, or
    a NUL byte in a string (no path, command or name may hold one; the OS refuses it much later)."""
    if depth > MAX_INPUT_DEPTH:
        return f"nests more than {MAX_INPUT_DEPTH} levels at {where or 'the top'}: no tool input is that deep"
    if isinstance(value, str):
        return f"field {where or 'value'} holds a NUL byte (\\u0000): remove it" if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and "\x00" in key:
            return f"has a field name with a NUL byte (\\u0000) under {where or 'the top'}: remove it"
        if (problem := _input_problem(item, f"{where}.{key}" if where else str(key), depth + 1)) is not None:
            return problem
    return None


def given(**options: Any) -> dict[str, Any]:
    """The options the user set: one left out takes the tool's own default (its Input model, the one
    place defaults and bounds are declared; `trainops tool schema NAME` lists them)."""
    return {name: value for name, value in options.items() if value is not None}


RESTART_FROM = typer.Option(None, "--restart-from",
                            help="given (the default: --restart-s), newest_node_drill (the restart the newest "
                                 "multi-node drill of this workspace measured) or measured_path (the median measured "
                                 "restart of --recovery-path).")
RECOVERY_PATH = typer.Option(None, "--recovery-path",
                             help="With --restart-from measured_path: the recovery path the job will use, "
                                  "in-process, spare-admitted or requeue.")


@app.command("env")
def env(
    ckpt_dir: Optional[str] = typer.Option(None, "--ckpt-dir",
                                           help="Where checkpoints go (default $TRAINOPS_HOME/runs)."),
    ckpt_test_mib: Optional[int] = typer.Option(None, "--ckpt-test-mib",
                                                help="Size of the checkpoint write test, MiB."),
    scheduler: Optional[str] = typer.Option(None, "--scheduler", help="local (the default) | slurm | kubernetes."),
    framework: Optional[str] = typer.Option(None, "--framework",
                                            help="Declare another framework: deepspeed, torchtitan, megatron report "
                                                 "their installed version; any other name needs --framework-version."),
    framework_version: Optional[str] = typer.Option(None, "--framework-version", help="Version of --framework."),
    measure_interconnect: Optional[bool] = typer.Option(
        None, "--measure-interconnect/--no-measure-interconnect",
        help="Measure inter-node all-reduce latency and bandwidth with a 2-node job (--scheduler slurm; ~10 s)."),
    as_json: bool = JsonOpt,
) -> None:
    """Declare the environment (SOP S1): hardware, versions, scheduler, measured bandwidth and peak.
    Options left out take declare_environment's defaults."""
    out = run_tool("declare_environment", given(
        ckpt_dir=ckpt_dir, ckpt_test_mib=ckpt_test_mib, scheduler=scheduler, framework=framework,
        framework_version=framework_version, measure_interconnect=measure_interconnect), as_json)
    emit(out, as_json, _render_env)


@plan_app.command("checkpoint")
def plan_checkpoint(
    save_s: float = typer.Option(..., "--save-s", help="Measured checkpoint write time, seconds."),
    restart_s: Optional[float] = typer.Option(None, "--restart-s",
                                              help="Restart time after a failure, seconds (or --restart-from)."),
    restart_from: Optional[str] = RESTART_FROM,
    recovery_path: Optional[str] = RECOVERY_PATH,
    mtbf_h: float = typer.Option(..., "--mtbf-h", help="Job mean time between failures, hours."),
    as_json: bool = JsonOpt,
) -> None:
    """Checkpoint interval by Young and Daly, expected waste, and a recommendation."""
    out = run_tool("plan_checkpoint_interval", given(save_s=save_s, restart_s=restart_s, restart_from=restart_from,
                                                     recovery_path=recovery_path, mtbf_h=mtbf_h), as_json)
    emit(out, as_json, render_fields("checkpoint interval"))


@plan_app.command("ettr")
def plan_ettr(
    gpus: Optional[int] = typer.Option(None, "--gpus", help="GPUs in the job."),
    days: Optional[float] = typer.Option(None, "--days", help="Simulated length, days."),
    profile: Optional[str] = typer.Option(None, "--profile",
                                          help="Failure profile: llama3 (the default), or a JSON FailureProfile."),
    detection_latency_s: Optional[float] = typer.Option(None, "--detection-latency-s",
                                                        help="Failure to detection, seconds."),
    detection_by_cause: list[str] = typer.Option([], "--detect",
                                                 help="Per-cause detection latency CAUSE=SECONDS (repeatable), e.g. "
                                                      "gpu_sdc=3600."),
    restart_s: Optional[float] = typer.Option(None, "--restart-s", help="Detection to training again, seconds."),
    restart_from: Optional[str] = RESTART_FROM,
    recovery_path: Optional[str] = RECOVERY_PATH,
    hot_spares: Optional[bool] = typer.Option(None, "--hot-spares/--no-hot-spares",
                                              help="Spare nodes replace failed ones at once (the default)."),
    node_replacement_s: Optional[float] = typer.Option(None, "--node-replacement-s",
                                                       help="Provisioning time without spares, seconds."),
    checkpoint_save_s: Optional[float] = typer.Option(None, "--checkpoint-save-s",
                                                      help="Time for a checkpoint to be durable, seconds."),
    checkpoint_mode: Optional[str] = typer.Option(None, "--checkpoint-mode", help="sync | async (the default)."),
    async_stall_s: Optional[float] = typer.Option(None, "--async-stall-s",
                                                  help="Training stall of an async checkpoint, seconds."),
    interval_min: Optional[float] = typer.Option(None, "--interval-min",
                                                 help="Checkpoint interval, minutes (default: Daly)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Random seed."),
    as_json: bool = JsonOpt,
) -> None:
    """Effective training time ratio under a failure profile (seeded simulation). Options left out
    take plan_effective_training_time's defaults (`trainops tool schema plan_effective_training_time`)."""
    profile_value: Any = profile
    if profile is not None and profile.lstrip().startswith("{"):
        try:
            profile_value = json.loads(profile)
        except json.JSONDecodeError as exc:
            fail(f"--profile is not valid JSON ({exc.msg}): pass llama3 or a FailureProfile object", as_json=as_json)
    by_cause: dict[str, str] = {}
    for item in detection_by_cause:
        cause, sep, seconds = item.partition("=")
        if not sep or not cause:
            fail(f"--detect {item!r} is not CAUSE=SECONDS: write it like gpu_sdc=3600", as_json=as_json)
        by_cause[cause] = seconds
    out = run_tool("plan_effective_training_time", given(
        gpus=gpus, days=days, profile=profile_value, detection_latency_s=detection_latency_s,
        detection_latency_s_by_cause=by_cause or None, restart_s=restart_s, restart_from=restart_from,
        recovery_path=recovery_path, hot_spares=hot_spares, node_replacement_s=node_replacement_s,
        checkpoint_save_s=checkpoint_save_s, checkpoint_mode=checkpoint_mode, async_stall_s=async_stall_s,
        checkpoint_interval_min=interval_min, seed=seed), as_json)
    emit(out, as_json, _render_ettr)


@plan_app.command("layout")
def plan_layout(
    config: Optional[str] = typer.Argument(None, help="Job config TOML (omit to use --preset)."),
    nproc: int = typer.Option(..., "--nproc", help="World size to plan for."),
    preset: Optional[str] = typer.Option(None, "--preset", help="Model preset."),
    overrides: list[str] = typer.Option([], "--set", help="section.key=value override (repeatable)."),
    as_json: bool = JsonOpt,
) -> None:
    """Validate a parallel layout for a world size without starting processes."""
    out = run_tool("plan_layout", {"config": config, "preset": preset, "overrides": overrides, "nproc": nproc}, as_json)
    if not out.valid:
        fail(f"layout invalid for nproc={nproc}: {out.error}", as_json=as_json, code=1)
    emit(out, as_json, _render_layout)


def _render_env(decl: Any) -> None:
    a, s = decl.accelerators, decl.software
    table = Table(title=f"environment declaration ({decl.declared_at:%Y-%m-%d %H:%M:%S} UTC)", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    accel = f"{a.count} x {a.model}" + (f", {a.memory_gib} GiB" if a.memory_gib else "")
    if a.kind == "cpu":
        accel += f" ({a.cpu_sockets} socket(s), {a.cpu_physical_cores} cores, {a.cpu_logical} logical)"
    rows = [
        ("host", decl.host), ("accelerators", accel), ("hardware generation", decl.hardware_generation),
        ("scale-up domain",
         f"{a.scale_up_domain.gpus} GPUs over {a.scale_up_domain.link}" if a.scale_up_domain else "n/a"),
        ("interconnect", decl.interconnect),
        ("software",
         f"python {s.python}, torch {s.torch}, CUDA {s.cuda or '-'}, NCCL {s.nccl or '-'}, gloo "
         f"{'yes' if s.gloo else 'no'}"),
        ("framework", f"{decl.framework.name} {decl.framework.version}"),
        ("scheduler",
         f"{decl.scheduler.kind} ({decl.scheduler.version}); partitions {', '.join(decl.scheduler.partitions)}"),
        ("hot spares", ", ".join(decl.scheduler.hot_spare_nodes)
         or ("none (the local scheduler has one node, the one the job runs on)" if decl.scheduler.kind == "local"
             else "none")),
        ("checkpoint write",
         f"{decl.checkpoint_storage.write_bandwidth_mib_s:.0f} MiB/s ({decl.checkpoint_storage.test_size_mib} MiB "
         f"to {decl.checkpoint_storage.path}, {decl.checkpoint_storage.filesystem}, fsync'd)"),
        ("compute peak",
         f"{decl.compute_peak.peak_tflops:.3f} TFLOP/s {decl.compute_peak.dtype} ({decl.compute_peak.source})"),
    ] + [("note", n) for n in decl.notes]
    for key, value in rows:
        table.add_row(key, escape(value))
    console().print(table)


def _render_ettr(out: Any) -> None:
    c = console()
    c.print(f"[bold]ETTR {out.ettr:.1%}[/] — {out.failures} failures in {out.wall_h:.0f} h "
            f"(job MTBF {out.job_mtbf_h:.2f} h, checkpoint every {out.checkpoint_interval_min:.1f} min); profile: "
            f"{escape(out.profile)}")
    table = Table(title="hours lost")
    table.add_column("cause / phase")
    table.add_column("failures", justify="right")
    table.add_column("hours", justify="right")
    for cause, hours in out.lost_h_by_cause.items():
        table.add_row(cause, str(out.failures_by_cause.get(cause, "")), f"{hours:.1f}")
    for phase, hours in out.lost_h_by_phase.items():
        table.add_row(f"[dim]phase: {phase}[/]", "", f"{hours:.1f}")
    c.print(table)


def _render_layout(out: Any) -> None:
    plan = out.plan
    c = console()
    layout = plan.get("layout", {})
    c.print(f"[bold green]valid[/] mesh {plan.get('mesh_dim_names')} = {plan.get('mesh_shape')}; "
            f"microbatches {plan.get('n_microbatches')}; max memory {plan.get('max_total_bytes', 0) / 2**30:.2f} "
            f"GiB/rank")
    table = Table(title="ranks")
    for column in ("rank", "coords", "stages", "layers", "params", "GiB"):
        table.add_column(column)
    for r in plan.get("ranks", []):
        table.add_row(str(r["rank"]), _cell(r["coords"]), _cell(r["stages"]), f"{len(r['layers'])}",
                      f"{r['params']:,}", f"{r['total_bytes'] / 2**30:.2f}")
    c.print(table)
    if layout:
        c.print(f"[dim]layout: {_cell(layout)}[/]")
