"""SOP commands: baseline, ablate, drill, evidence, sop, skill. Thin wiring over `skills`;
the skills (and torch, matplotlib behind them) are imported inside each command."""
from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import List, Optional

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from trainops.output import console, emit, fail, table
from trainops.run_folder import RunFiles
from trainops.skills import ablation as skill_ablation
from trainops.skills import baseline as skill_baseline
from trainops.skills.drill import drill as skill_drill
from trainops.skills.drill.drill import DrillRefused
from trainops.skills.evidence.pack import PackRefused, load
from trainops.skills.knobs import KnobError, catalogue, parse_arm, plan_order
from trainops.skills.registry import all_skills, get
from trainops.skills.request import JobRequest
from trainops.skills.sop import build_from_runs, run
from trainops.skills.sop_session import SopSettings
from trainops.tools.base import ToolError
from trainops.tools.frameworks import get_adapter
from trainops.tools.frameworks.base import FrameworkRefused
from trainops.workspace import packs_dir

JSON = typer.Option(False, "--json", help="Print JSON for machines.")
SCHED = typer.Option("local", "--scheduler", help="local, slurm or kubernetes.")
NODES = typer.Option(1, "--nodes", min=1, max=64,
                     help="Nodes, each running --nproc ranks (more than one needs --scheduler slurm).")
MONITOR = typer.Option("embedded", "--monitor", help="embedded (metrics files) or prometheus.")
SETS = typer.Option(None, "--set", help="section.key=value override (repeatable).")
FRAMEWORK = typer.Option("trainops", "--framework",
                         help="Whose job: trainops (embedded trainer), deepspeed, torchtitan or megatron.")


def _progress(as_json: bool):
    err = console(stderr=True)
    return (lambda msg: None) if as_json else (lambda msg: err.print(f"[cyan]»[/] {escape(msg)}", highlight=False))


def _request(config: Optional[str], sets: Optional[List[str]], nproc: int, scheduler: str, as_json: bool,
             monitor: str = "embedded", framework: str = "trainops", nodes: int = 1, monitors=("embedded",)):
    if monitor not in monitors:
        fail(f"--monitor: {monitor!r} does not feed this command's statistics (summarize_run reads each run's "
             "metrics.jsonl); use --monitor embedded, `trainops sop --monitor prometheus` to declare and check a "
             "Prometheus, and `trainops tool call query_metrics` for its series", as_json=as_json)
    if config and not Path(config).is_file():
        fail(f"CONFIG: file {config!r} does not exist; pass a job config TOML or omit it for the tiny preset",
             as_json=as_json)
    try:
        adapter = get_adapter(framework)
    except FrameworkRefused as exc:
        fail(f"--{exc}", as_json=as_json)
    if nodes > 1 and scheduler == "local":
        fail(f"--nodes {nodes}: the local scheduler has one node; use --scheduler slurm (`trainops sandbox up` "
             "makes a Slurm cluster of namespace nodes on this host) or --nodes 1", as_json=as_json)
    version = f"{adapter.display_name} {adapter.version()}" if framework != "trainops" else "undeclared"
    return JobRequest(config=config, preset=None if config else "tiny", overrides=list(sets or []), nproc=nproc,
                      nodes=nodes, scheduler=scheduler, framework=framework, framework_version=version)


def _guard(fn, as_json: bool):
    """Run a skill; refusals and tool errors become one clear line and exit code 2."""
    try:
        return fn()
    except (KnobError, DrillRefused, PackRefused, FrameworkRefused, ToolError, LookupError, ValueError,
            ValidationError) as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), "")  # matplotlib's start with \n
        fail(first or f"{type(exc).__name__} with no message", as_json=as_json)


app = typer.Typer()


evidence = typer.Typer(help="Evidence packs: build from runs, show.", no_args_is_help=True)


skill = typer.Typer(help="Skills: list, show, run a SKILL.md step by step.", no_args_is_help=True)
app.add_typer(evidence, name="evidence")
app.add_typer(skill, name="skill")


@app.command()
def baseline(config: Optional[str] = typer.Argument(None, help="Job config TOML (default: tiny preset)."),
             repeats: int = typer.Option(3, min=1, help="Independent runs."), nproc: int = typer.Option(2, min=1),
             sets: Optional[List[str]] = SETS, scheduler: str = SCHED, monitor: str = MONITOR, as_json: bool = JSON,
             framework: str = FRAMEWORK, nodes: int = NODES):
    """S2: repeats of the unchanged config; median and spread of step time, tokens/s, MFU, labelled from
    the config the runs used and the environment declaration the command makes first."""
    req = _guard(_request(config, sets, nproc, scheduler, as_json, monitor, framework, nodes).loaded, as_json)
    summary, _, _ = _guard(lambda: skill_baseline.measure(req, repeats, progress=_progress(as_json)), as_json)
    emit(summary, as_json, lambda s: table(
        f"baseline: {s.model}, {s.parallel_layout}, {s.precision}, {s.labels.framework} "
        f"{s.labels.framework_version} on {s.labels.hardware}, {s.repeats} repeats", ["metric", "median", "spread"],
        [[n, f"{m.median:.4f}", f"{m.spread_pct:.1f}%"] for n, m in
         (("step_time_s", s.step_time_s), ("tokens_per_s", s.tokens_per_s), ("mfu_pct", s.mfu_pct))]))


@app.command()
def ablate(config: Optional[str] = typer.Argument(None, help="Job config TOML (default: tiny preset)."),
           knob: Optional[List[str]] = typer.Option(None, "--knob",
                                                    help="NAME=VALUE; one variable per arm (repeat for more arms)."),
           list_knobs: bool = typer.Option(False, "--list", help="Show the knob catalogue."),
           repeats: int = typer.Option(3, min=1), nproc: int = typer.Option(2, min=1),
           sets: Optional[List[str]] = SETS, scheduler: str = SCHED, monitor: str = MONITOR, as_json: bool = JSON,
           framework: str = FRAMEWORK, nodes: int = NODES):
    """S3/S4: single-variable arms up the rollout ladder, 1 -> 2 -> ... -> --nproc processes, then nodes,
    each rung at the target's per-rank batch against the baseline at that rung; the first rung where the
    gain is gone stops the ladder, reverts, verifies and hands the stop to a human."""
    req = _request(config, sets, nproc, scheduler, as_json, monitor, framework, nodes)
    if list_knobs:
        knobs = plan_order(list(catalogue(framework).values()))
        return emit(knobs, as_json, lambda ks: table("ablation knobs (plan order)",
                                                      ["knob", "category", "values", "expected effect"],
                                                      [[k.name, k.category, "|".join(k.values), k.expected_effect]
                                                       for k in ks]))
    if not knob:
        fail("--knob: no arm given; pass --knob NAME=VALUE (see trainops ablate --list)", as_json=as_json)
    req = _guard(req.loaded, as_json)  # the one load of the job's config; every step passes it on
    rows = _guard(lambda: skill_ablation.ablate(req, knob, repeats, progress=_progress(as_json))[0], as_json)
    emit(rows, as_json, _ladder_table)


def _ladder_table(rows) -> None:
    """One line per rung; a stopped ladder's reason, rollback and human item beneath the table."""
    table("ablation ladder", ["knob", "value", "rung", "MFU change", "noise band", "verdict"],
           [[r.knob, r.value, r.scale, f"{r.mfu_change_pct:.1f}%", f"±{r.noise_band_pct:.1f}%",
             r.verdict + (" (gain gone: ladder stopped)" if r.stop else "")] for r in rows])
    out = console()
    for r in rows:
        if r.ladder_note:
            out.print(f"{r.knob}: {r.ladder_note}", markup=False)
        if r.stop:
            verified = "matches" if r.stop.verification_matches else "does NOT match"
            out.print(f"{r.knob}={r.value} stopped: {r.stop.reason}\n  why: {r.stop.topology_hint}\n  rolled back to "
                      f"{r.knob}={r.stop.reverted_to}; verification {verified} the baseline "
                      f"({r.stop.verification_change_pct:+.1f}% against ±{r.stop.verification_band_pct:.1f}%)\n"
                      f"  human: {r.stop.human_item}", markup=False)


@app.command()
def drill(config: Optional[str] = typer.Argument(None, help="Job config TOML with [checkpoint] enable = true."),
          fault: List[str] = typer.Option(["crash"], "--fault",
                                          help="crash | node-loss | hang | checkpoint-corruption | "
                                               "nan (loss anomaly) | bitflip (silent data corruption, DDP replicas) | "
                                               "straggler (detection only: recovery needs a spare node) | "
                                               "node-crash | power-loss | partition | slow-network (a real node or "
                                               "link of a `trainops sandbox` cluster: --scheduler slurm --nodes 2)."),
          nproc: int = typer.Option(2, min=1), sets: Optional[List[str]] = SETS, scheduler: str = SCHED,
          monitor: str = MONITOR, as_json: bool = JSON, framework: str = FRAMEWORK, nodes: int = NODES):
    """S5: inject, detect, isolate, restart from the newest good checkpoint; time each phase."""
    req = _request(config, sets, nproc, scheduler, as_json, monitor, framework, nodes)
    for kind in fault:
        if kind not in skill_drill.DRILLS:
            fail(f"--fault: unknown fault {kind!r}; use one of {', '.join(skill_drill.DRILLS)}", as_json=as_json)
    req = _guard(req.loaded, as_json)  # the one load of the job's config; every step passes it on
    _guard(lambda: skill_drill.require_checkpoints(req), as_json)
    results = _guard(lambda: skill_drill.run_drills(req, fault, progress=_progress(as_json))[0], as_json)
    emit(results, as_json, lambda rs: table("drills", ["fault", "detection", "isolation", "recovery",
                                                        "steps lost", "checkpoint"],
                                             [_drill_row(d) for d in rs]))


def _drill_row(d) -> list:
    if not hasattr(d, "recovery_time_s"):  # a detection-only drill says why recovery was not measured
        return [d.fault, f"{d.detection_latency_s:.2f} s", d.isolation_granularity, d.recovery, "-", "-"]
    return [d.fault, f"{d.detection_latency_s:.2f} s", d.isolation_granularity, f"{d.recovery_time_s:.1f} s",
            d.steps_lost, d.checkpoint_used]


@evidence.command("build")
def evidence_build(run_dirs: List[str] = typer.Argument(...,
                                                        help="Run folders (baseline repeats; drills are picked up)."),
                   scheduler: str = SCHED, as_json: bool = JSON):
    """Build, validate and write a pack from finished runs."""
    for run_dir in run_dirs:
        if not RunFiles(run_dir).metrics.exists():
            fail(f"RUNDIR: {run_dir!r} has no metrics.jsonl; pass a finished run folder ($TRAINOPS_HOME/runs/RUN)",
                 as_json=as_json)
    folder = _guard(lambda: build_from_runs(run_dirs, scheduler), as_json)
    emit({"pack_dir": str(folder)}, as_json, lambda o: console().print(f"pack written: {o['pack_dir']}", markup=False))


@evidence.command("show")
def evidence_show(pack: str = typer.Argument(..., help="Pack id or folder."), as_json: bool = JSON,
                  open_report: bool = typer.Option(False, "--open", help="Open report.html in your web browser.")):
    """Print a pack's report (or its JSON); --open shows report.html in the browser."""
    folder = Path(pack) if Path(pack).is_dir() else packs_dir() / pack
    if not (folder / "evidence.json").exists():
        fail(f"PACK: no pack {pack!r} (looked in {folder}); list them with ls $TRAINOPS_HOME/packs", as_json=as_json)
    if open_report and not webbrowser.open((folder / "report.html").resolve().as_uri()):
        fail(f"--open: no web browser found to open {folder / 'report.html'}; set BROWSER or open the file "
             "yourself", as_json=as_json)
    emit(load(folder), as_json, lambda _p: console().print((folder / "report.md").read_text(), markup=False))


@app.command()
def sop(config: Optional[str] = typer.Argument(None, help="Job config TOML (default: embedded tiny job)."),
        quick: bool = typer.Option(False, "--quick", help="Fewer repeats, one arm, one drill (~2 minutes)."),
        knob: Optional[List[str]] = typer.Option(None, "--knob", help="Arms NAME=VALUE (default plan otherwise)."),
        fault: Optional[List[str]] = typer.Option(None, "--fault",
                                                  help="Drill kinds (default: the framework's; trainops: crash, full "
                                                       "run crash, hang, bitflip)."),
        mtbf_h: Optional[float] = typer.Option(None, "--mtbf-h", min=0.001,
                                               help="Declared job MTBF, hours: used only while the interruption "
                                                    "record is too short to measure one (default: an assumed 24 h, "
                                                    "labelled so)."),
        ettr_window_s: float = typer.Option(3600.0, "--ettr-window", min=1.0, max=30 * 86400.0,
                                            help="Effective-training-time window, seconds (S2 and R-ESC-1)."),
        resume: Optional[str] = typer.Option(None, "--resume",
                                             help="Continue SOP session ID (sop-sessions/ID.json) from its last "
                                                  "finished step, with the settings it was declared with."),
        scheduler: str = SCHED, monitor: str = MONITOR, as_json: bool = JSON, framework: str = FRAMEWORK,
        nodes: int = NODES,
        partition: Optional[str] = typer.Option(None, "--partition",
                                                help="Slurm partition the job runs in (default: the cluster's "
                                                     "default); S1 declares its nodes and idle spares.")):
    """S1..S6 end to end; ends with an evidence pack waiting for approval.

    Each step is its own tool call on one SOP session; --resume continues a session without rerunning
    its finished steps. With --monitor prometheus, S1 checks the Prometheus answers and declares it;
    the steps' figures are still read from each run's metrics.jsonl."""
    _request(config, None, 2, scheduler, as_json, monitor, framework, monitors=("embedded", "prometheus"))
    for spec in knob or []:
        _guard(lambda spec=spec: parse_arm([spec], framework), as_json)
    settings = _settings(as_json, config=config, quick=quick, scheduler=scheduler, knobs=knob or [],
                         faults=fault or [], mtbf_h=mtbf_h, ettr_window_s=ettr_window_s, framework=framework,
                         nodes=nodes, partition=partition, monitor=monitor)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), disable=as_json,
                  transient=False, console=console()) as bar:
        task = bar.add_task("SOP", total=None)
        result = _guard(lambda: run(settings, progress=None if as_json else _reporter(bar, task), resume=resume),
                        as_json)
    emit(result, as_json, _closing)


def _settings(as_json: bool, **fields) -> SopSettings:
    """The SOP's settings, or the one refusal that names the option and the fix."""
    try:
        return SopSettings(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        option = f"--{str(error['loc'][0]).replace('_', '-')}: " if error["loc"] else ""
        fail(option + error["msg"].removeprefix("Value error, "), as_json=as_json)


def _reporter(bar: Progress, task):
    """Every progress message printed whole above the live line (it wraps; the live line would cut it at
    the terminal's width), and the spinner's label kept at the SOP step it is in."""
    def report(msg: str) -> None:
        bar.console.print(f"» {msg}", markup=False, highlight=False)
        if msg[:1] == "S" and msg[1:2].isdigit():
            bar.update(task, description=escape(msg))
    return report


def _closing(r) -> None:
    """Where the human starts: the figures, the verdict, the report to read and the command to sign."""
    out = console()
    for line in r.headline.lines():
        out.print(line, markup=False, highlight=False)
    out.print(f"verdict: [bold]{r.verdict}[/] ({escape('; '.join(r.blockers) or 'no blockers')})", highlight=False)
    out.print(f"pack {r.pack_id}, awaiting your decision\nread:    {r.report_html}\napprove: {r.approve_command}\n"
              f"         ({r.signing_note} Reject with trainops reject {r.pack_id} --note REASON.)\n"
              f"elapsed: {r.elapsed_s:.0f} s", markup=False, highlight=False, soft_wrap=False)


@skill.command("list")
def skill_list(as_json: bool = JSON):
    """Every skill and its step count."""
    skills = all_skills()
    data = [{"name": s.name, "steps": len(s.steps), "cli": s.cli, "description": s.description}
            for s in skills.values()]
    emit(data, as_json, lambda d: table("skills", ["name", "steps", "command", "description"],
                                         [[x["name"], x["steps"], x["cli"], x["description"][:90]] for x in d]))


@skill.command("show")
def skill_show(name: str, as_json: bool = JSON):
    """A skill's SKILL.md, or its steps and their implementations with --json."""
    found = _guard(lambda: get(name), as_json)
    emit({"name": found.name, "path": str(found.path), "steps": [s.__dict__ for s in found.steps]}, as_json,
         lambda _d: console().print(found.path.read_text(), markup=False))


@skill.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                        "allow_interspersed_args": False})
def skill_run(ctx: typer.Context, name: str = typer.Argument(..., help="Skill name (trainops skill list)."),
              as_json: bool = JSON):
    """Run a skill as the command its SKILL.md declares (metadata.cli); everything after NAME goes to
    that command, e.g. `trainops skill run ablation --list` is `trainops ablate --list`."""
    as_json = as_json or "--json" in ctx.args
    found = _guard(lambda: get(name), as_json)
    path = _guard(found.command, as_json)
    command = ctx.find_root().command  # the whole `trainops` app, not this sub-app
    for word in path:
        command = command.get_command(ctx, word) if hasattr(command, "get_command") else None  # a group
        if command is None:
            fail(f"skill {name!r} declares `{found.cli}` in {found.path}, but trainops has no command "
                 f"`trainops {' '.join(path)}`; fix its metadata.cli", as_json=as_json)
    args = [*path, *ctx.args, *(["--json"] if as_json and "--json" not in ctx.args else [])]
    ctx.find_root().command.main(args=args, prog_name="trainops", standalone_mode=True)
