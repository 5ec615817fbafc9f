"""`trainops eval`: record a real workspace as an agent-benchmark scenario, and run the suite
against a provider (benchmarks/agent_eval). Thin wiring; the agent and LangChain load lazily."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer
from pydantic import ValidationError

from trainops.agents.providers import AgentSettings, ProviderError, load_settings
from trainops.benchmarks.agent_eval import recorder, runner, scenario, scripted
from trainops.benchmarks.agent_eval.scenario import SCENARIOS_DIR, Expected, Never, Scenario
from trainops.output import console, emit, fail

app = typer.Typer(help="The agent benchmark: recorded scenarios, replayed and scored (pass@1, pass^k).",
                  no_args_is_help=True)


def _plants(values: list[str]) -> dict[str, str]:
    plants = {}
    for value in values:
        path, sep, text = value.partition("=")
        if not sep or not path or not text:
            raise typer.BadParameter(f"--plant {value!r}: write FILE=TEXT, FILE relative to the workspace, e.g. "
                                     "runs/RUN/logs/rank0.log='WARNING ...'")
        plants[path] = text
    return plants


@app.command("record")
def record(
    source: Path = typer.Argument(..., help="A workspace ($TRAINOPS_HOME of a drill, run or SOP) or one runs/RUN."),
    name: str = typer.Option(..., "--name", help="Scenario name (its folder)."),
    request: str = typer.Option(..., "--request", help="What the agent is asked."),
    tags: List[str] = typer.Option(..., "--tag", help="easy|medium|hard and kinds (crash, injection, sop, ...)."),
    verdict: Optional[str] = typer.Option(None, "--verdict", help="diagnosed | inconclusive | healthy | answered"),
    fault_kind: Optional[str] = typer.Option(None, "--fault-kind"),
    cause_class: Optional[str] = typer.Option(None, "--cause-class"),
    ranks: Optional[List[int]] = typer.Option(None, "--rank"),
    nodes: Optional[List[str]] = typer.Option(None, "--node"),
    evidence: Optional[List[str]] = typer.Option(None, "--evidence", help="Text a cited quote must contain."),
    actions: Optional[List[str]] = typer.Option(None, "--action", help="Tool the answer must propose."),
    approvals: Optional[List[str]] = typer.Option(None, "--approval", help="Gated tool the agent must ask for."),
    answer_contains: Optional[List[str]] = typer.Option(None, "--answer-contains"),
    injected_tools: Optional[List[str]] = typer.Option(None, "--injected-tool", help="Tool planted text asks for."),
    injected_marker: str = typer.Option("", "--injected-marker"),
    other_tenants: Optional[List[str]] = typer.Option(None, "--other-tenant"),
    plants: Optional[List[str]] = typer.Option(
        None, "--plant", help="FILE=TEXT appended to a frozen log; for a .json or .jsonl record, TEXT is a JSON "
        "object of fields set in it (in every line of a .jsonl)."),
    max_tool_calls: int = typer.Option(15, "--max-tool-calls", min=1),
    dest: Optional[Path] = typer.Option(None, "--dest", help="Scenarios folder (default: the packaged one)."),
    scheduler: str = typer.Option("local", "--scheduler", help="The live backend whose states are captured."),
    overwrite: bool = typer.Option(False, "--overwrite"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Freeze SOURCE into DEST/NAME: the workspace minus checkpoint payloads, the scheduler's job
    and node states now, and scenario.toml (request, tags, expected outcome, must-never-happen)."""
    try:
        scenario = Scenario(
            name=name, request=request, tags=tags, recorded_from=str(source), max_tool_calls=max_tool_calls,
            expected=Expected(verdict=verdict, fault_kind=fault_kind, cause_class=cause_class, ranks=ranks or [],
                              nodes=nodes or [], evidence=evidence or [], actions=actions or [],
                              approvals=approvals or [], answer_contains=answer_contains or []),
            never=Never(injected_tools=injected_tools or [], injected_marker=injected_marker,
                        other_tenants=other_tenants or []))
        folder = recorder.record(source, scenario, dest or SCENARIOS_DIR, _plants(plants or []), scheduler,
                                 overwrite)
    except (ValidationError, ValueError, OSError) as exc:
        fail(f"eval record: {exc}", as_json=as_json)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    emit({"scenario": str(folder), "bytes": size}, as_json,
         lambda r: console().print(f"recorded {r['scenario']} ({r['bytes']} bytes)", markup=False))


@app.command("run")
def run(
    provider: str = typer.Option("offline", "--provider", help="offline | openai | anthropic | scripted"),
    model: Optional[str] = typer.Option(None, "--model", help="Model name; for --provider scripted: "
                                                              "obedient | lazy | overconfident | looping | competent."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint."),
    k: int = typer.Option(5, "--k", min=1, max=100, help="Runs per scenario (pass^k needs all k to pass)."),
    scenarios: Optional[List[str]] = typer.Option(None, "--scenario", help="Only these scenarios."),
    folder: Optional[Path] = typer.Option(None, "--scenarios", help="Scenarios folder (default: packaged)."),
    max_steps: int = typer.Option(12, "--max-turns", "--max-steps", min=1, help="Model turns per run."),
    max_tokens: int = typer.Option(60000, "--max-tokens", min=1, help="Prompt + completion tokens per run."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Replay every scenario k times against the provider and score it without a judge model."""
    try:
        chosen = scenario.load_all(folder or scenario.SCENARIOS_DIR, scenarios)
    except (ValueError, OSError) as exc:
        fail(f"eval run: {exc}", as_json=as_json)
    if not chosen:
        fail("eval run: no scenarios found; record one with `trainops eval record`", as_json=as_json)
    progress = None if as_json else (lambda line: console(stderr=True).print(line, markup=False))
    if provider == "scripted":
        result = _run_scripted(model or "", chosen, k, (max_steps, max_tokens), progress, as_json)
    else:
        try:
            settings = load_settings(provider, model, base_url)
        except ProviderError as exc:
            fail(str(exc), as_json=as_json)
        result = runner.run_suite(chosen, runner.agent_run(settings, max_steps, max_tokens), k, settings.provider,
                                  settings.model or provider, progress)
    emit(result.model_dump(mode="json") if as_json else result, as_json,
         lambda r: console().print(runner.table(r), markup=False))


@app.command("publish")
def publish(k: int = typer.Option(5, "--k", min=1, max=100, help="Runs per scenario of the offline policy."),
            scripted_k: int = typer.Option(1, "--scripted-k", min=1, max=100),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """Run the offline policy and the four scripted models on every scenario and rewrite the
    agent-eval section of benchmarks/RESULTS.md."""
    path = runner.publish(k, scripted_k)
    emit({"results": str(path)}, as_json, lambda r: console().print(f"wrote {r['results']}", markup=False))


def _run_scripted(name: str, chosen, k: int, budget: tuple[int, int], progress, as_json: bool):
    if name not in scripted.BEHAVIOURS:
        fail(f"--model {name!r}: for --provider scripted use one of {', '.join(scripted.BEHAVIOURS)}",
             as_json=as_json)
    os.environ.setdefault("TRAINOPS_SCRIPTED_KEY", "scripted-model-no-secret")
    with scripted.ScriptedServer(scripted.BEHAVIOURS[name]) as server:
        settings = AgentSettings(provider="openai", model=f"scripted-{name}", base_url=server.base_url,
                                 api_key_env="TRAINOPS_SCRIPTED_KEY", sources={"base_url": "command line"})
        return runner.run_suite(chosen, runner.agent_run(settings, *budget), k, "scripted", name, progress)
