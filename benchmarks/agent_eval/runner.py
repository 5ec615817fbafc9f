"""`trainops eval run`: each scenario k times, each run in a fresh copy of its frozen workspace
with the replay backends serving it; scored (scoring.py) and summed up per tag and overall as
pass@1 (the share of runs that pass) and pass^k (the share of scenarios whose k runs all pass)."""
from __future__ import annotations

import datetime
import json
import os
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Sequence

from pydantic import BaseModel, Field

from trainops.agents.agent_tools import agent_registry
from trainops.agents.echo import unechoed
from trainops.agents.providers import AgentSettings, load_settings
from trainops.benchmarks.agent_eval import scripted
from trainops.benchmarks.agent_eval.replay import replaying
from trainops.benchmarks.agent_eval.scenario import (
    EXTRA_SETS,
    Scenario,
    load_all,
    materialize,
    workspace_at,
)
from trainops.benchmarks.agent_eval.scoring import Score, corpus_of, score
from trainops.benchmarks.harness import write_section
from trainops.tools.calls import call
from trainops.tools.catalog import current_registry
from trainops.tools.context import operator_session, serving

AgentRun = Callable[[Scenario], dict[str, Any]]
"""One agent run on a scenario whose replay is active: returns its AgentTrace as a dict."""


class TagResult(BaseModel):
    tag: str
    scenarios: int
    pass_at_1: float = Field(description="Share of all runs that passed.")
    pass_hat_k: float = Field(description="Share of scenarios that passed every one of their k runs.")


class SuiteResult(BaseModel):
    provider: str
    model: str
    k: int
    overall: TagResult
    tags: list[TagResult]
    scores: list[Score]
    tool_calls_mean: float
    tokens_mean: float
    prompt_tokens_per_turn_mean: float = Field(0.0, description="Prompt tokens of one model turn, over every turn.")
    prompt_tokens_per_turn_median: float = Field(0.0, description="The median prompt of a model turn.")
    prompt_tokens_per_turn_max: int = Field(0, description="The largest prompt of any turn.")
    wall_s_mean: float
    cost_usd: float | None
    judge: str = Field("none: every check reads the structured answer, the trace or the gate's log",
                       description="Where a judge model graded free text, and which.")



UNREAD = ("transcripts", "audit.jsonl", "agent.sqlite")
"""The agent's own records in a workspace: they hold what the model said, so they ground no quote."""


def _workspace_texts(home: Path) -> list[str]:
    """The frozen workspace's text files as the run begins, less the agent's own records."""
    texts = []
    for path in sorted(home.rglob("*")):
        if path.is_file() and not path.is_symlink() and not set(path.relative_to(home).parts) & set(UNREAD):
            try:
                texts.append(path.read_text())
            except UnicodeDecodeError:
                continue
    return texts


def _read_outputs(calls: list[dict], world: str) -> dict[str, list[str]]:
    """What the run's read calls returned, by tool, less what each echoed of its own arguments (the
    replay answers the same call the same way again); `world`: the frozen workspace, folded."""
    registry, outputs = current_registry(), defaultdict(list)
    for item in calls:
        tool, args = item.get("tool", ""), item.get("args") or {}
        if item.get("status") == "ok" and tool in registry and registry[tool].risk == "read":
            try:
                result = unechoed(call(tool, args).model_dump(mode="json"), args, world)
                outputs[tool].append(json.dumps(result, ensure_ascii=False))
            except Exception as exc:  # the agent saw this error as its answer
                outputs[tool].append(str(unechoed(str(exc), args, world) or ""))
    return dict(outputs)


def run_once(scenario: Scenario, agent: AgentRun) -> Score:
    """One run in a fresh copy of the scenario's workspace; the copy is removed after scoring."""
    with tempfile.TemporaryDirectory(prefix=f"trainops-eval-{scenario.name}-") as tmp:
        home = materialize(scenario, Path(tmp) / "home")
        world = _workspace_texts(home)
        frozen = corpus_of(world, {}).world  # as the run began: nothing the agent writes counts
        with workspace_at(home), serving(agent_registry), replaying(home) as replay:
            try:
                trace = agent(scenario)
            except Exception as exc:  # the run's outcome, scored as an error; the suite goes on
                trace = {"answer": None, "stop_reason": "error", "detail": f"{type(exc).__name__}: {exc}"}
            with operator_session():
                outputs = _read_outputs(trace.get("tool_calls") or [], frozen)
            return score(scenario, trace, replay.mutations(), corpus_of(world, outputs))


def _tag_result(tag: str, scores: list[Score], k: int) -> TagResult:
    by_scenario: dict[str, list[bool]] = defaultdict(list)
    for s in scores:
        by_scenario[s.scenario].append(s.passed)
    runs = [p for passes in by_scenario.values() for p in passes]
    return TagResult(tag=tag, scenarios=len(by_scenario), pass_at_1=round(sum(runs) / len(runs), 3),
                     pass_hat_k=round(sum(all(p) for p in by_scenario.values()) / len(by_scenario), 3))


def summarize(provider: str, model: str, k: int, scores: list[Score]) -> SuiteResult:
    tags = sorted({t for s in scores for t in s.tags})
    costs = [s.cost_usd for s in scores if s.cost_usd is not None]
    n = max(len(scores), 1)
    turns = [t for s in scores for t in s.prompt_tokens_per_turn]
    return SuiteResult(provider=provider, model=model, k=k, overall=_tag_result("overall", scores, k),
                       tags=[_tag_result(t, [s for s in scores if t in s.tags], k) for t in tags], scores=scores,
                       tool_calls_mean=round(sum(s.tool_calls for s in scores) / n, 2),
                       tokens_mean=round(sum(s.tokens for s in scores) / n, 1),
                       prompt_tokens_per_turn_mean=round(sum(turns) / len(turns), 1) if turns else 0.0,
                       prompt_tokens_per_turn_median=statistics.median(turns) if turns else 0.0,
                       prompt_tokens_per_turn_max=max(turns, default=0),
                       wall_s_mean=round(sum(s.wall_s for s in scores) / n, 3),
                       cost_usd=round(sum(costs), 6) if costs else None)


def run_suite(scenarios: list[Scenario], agent: AgentRun, k: int, provider: str, model: str,
              progress: Callable[[str], None] | None = None) -> SuiteResult:
    scores = []
    for scenario in scenarios:
        for i in range(k):
            result = run_once(scenario, agent)
            scores.append(result)
            if progress:
                verdict = "pass" if result.passed else "FAIL " + ", ".join(result.failed())
                progress(f"{scenario.name} run {i + 1}/{k}: {verdict}")
    return summarize(provider, model, k, scores)


def agent_run(settings, max_steps: int = 12, max_tokens: int = 60000) -> AgentRun:
    """The project's agent (agent_run.run_agent) on `settings`' provider."""
    from trainops.benchmarks.agent_eval.agent_run import run_agent

    def run(scenario: Scenario) -> dict[str, Any]:
        return run_agent(scenario.request, settings=settings, max_steps=max_steps,
                         max_tokens=max_tokens).model_dump(mode="json")

    return run


def table(result: SuiteResult) -> str:
    """The results table (markdown): one row per tag, then overall, then efficiency."""
    rows = [f"| tag | scenarios | pass@1 | pass^{result.k} |", "|---|---|---|---|"]
    for t in [*result.tags, result.overall]:
        rows.append(f"| {t.tag} | {t.scenarios} | {t.pass_at_1:.2f} | {t.pass_hat_k:.2f} |")
    cost = "not reported" if result.cost_usd is None else f"${result.cost_usd:.4f}"
    rows.append("")
    rows.append(f"Mean per run: {result.tool_calls_mean} tool calls, {result.tokens_mean} tokens, "
                f"{result.wall_s_mean} s; cost {cost}. Prompt tokens per model turn: mean "
                f"{result.prompt_tokens_per_turn_mean}, median {result.prompt_tokens_per_turn_median}, max "
                f"{result.prompt_tokens_per_turn_max}. "
                f"Judge model: {result.judge}.")
    return "\n".join(rows)


RESULTS_BEGIN, RESULTS_END = "<!-- agent-eval:begin -->", "<!-- agent-eval:end -->"


def _set_line(label: str, folder: str, about: str, result: SuiteResult) -> list[str]:
    missed = sorted({s.scenario for s in result.scores if not s.passed})
    acting = sum(1 for s in result.scores for c in s.checks if c.name == "question_never_acts" and not c.passed)
    return ["", f"{label}: {len(result.scores) // result.k} requests (benchmarks/agent_eval/{folder}), {about}: "
            f"offline policy pass@1 {result.overall.pass_at_1:.2f}, pass^k {result.overall.pass_hat_k:.2f} "
            f"(k={result.k}); questions that got a mutating tool: {acting}"
            + (f"; missed: {', '.join(missed)}." if missed else ".")]


def render_results(results: list[SuiteResult], scenarios: int,
                   extra: Sequence[tuple[str, Path, str, SuiteResult]] = ()) -> str:
    """The agent-eval section of benchmarks/RESULTS.md: one row per agent, then per-tag pass^k."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [RESULTS_BEGIN, "## Agent benchmark (`trainops eval run`)", "",
             f"Measured {when}: {scenarios} scenarios recorded from real drills and runs on this machine "
             "(benchmarks/agent_eval/scenarios), k runs each, replayed; scored without a judge model.", "",
             "| agent | k | pass@1 | pass^k | tool calls / run | tokens / run | prompt tokens / turn: median (max) "
             "| s / run |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        name = "offline policy" if r.provider == "offline" else f"{r.provider}: {r.model}"
        lines.append(f"| {name} | {r.k} | {r.overall.pass_at_1:.2f} | {r.overall.pass_hat_k:.2f} | "
                     f"{r.tool_calls_mean} | {r.tokens_mean} | {r.prompt_tokens_per_turn_median} "
                     f"({r.prompt_tokens_per_turn_max}) | {r.wall_s_mean} |")
    tags = sorted({t.tag for r in results for t in r.tags})
    lines += ["", "pass^k per tag:", "", "| tag | " + " | ".join(
        "offline" if r.provider == "offline" else r.model for r in results) + " |",
        "|---|" + "---|" * len(results)]
    for tag in tags:
        cells = [next((f"{t.pass_hat_k:.2f}" for t in r.tags if t.tag == tag), "-") for r in results]
        lines.append(f"| {tag} | " + " | ".join(cells) + " |")
    for label, folder, about, result in extra:
        lines += _set_line(label, folder.name, about, result)
    lines += ["", "The scripted models answer over the real OpenAI wire protocol (benchmarks/agent_eval/scripted.py). "
              "Four must fail: obedient by not answering (a question never offers it the planted call), "
              "lazy and overconfident on evidence, looping on the budget. The competent one "
              "(benchmarks/agent_eval/competent.py: generic, it reads only the request body: the understood request, "
              "the offered schemas and the tool results) must pass within the default budget (12 turns, 60,000 "
              "tokens a run). "
              "A real model runs the same suite: `trainops eval run --provider openai --model M --k 5`.",
              RESULTS_END]
    return "\n".join(lines)


def publish(k: int, scripted_k: int = 1, max_steps: int = 12) -> Path:
    """Run the offline policy (k times) and the scripted models (`scripted_k` times: each is a pure
    function of the conversation) on every scenario; rewrite the agent-eval section."""
    scenarios = load_all()
    results = [run_suite(scenarios, agent_run(load_settings("offline"), max_steps), k, "offline", "sop-policy")]
    extra = [(label, folder, about, run_suite(load_all(folder), agent_run(load_settings("offline"), max_steps), k,
                                              "offline", "sop-policy"))
             for label, folder, about in EXTRA_SETS if folder.is_dir()]
    os.environ.setdefault("TRAINOPS_SCRIPTED_KEY", "scripted-model-no-secret")
    for name, behaviour in scripted.BEHAVIOURS.items():
        with scripted.ScriptedServer(behaviour) as server:
            settings = AgentSettings(provider="openai", model=f"scripted-{name}", base_url=server.base_url,
                                     api_key_env="TRAINOPS_SCRIPTED_KEY", sources={"base_url": "command line"})
            results.append(run_suite(scenarios, agent_run(settings, max_steps), scripted_k, "scripted", name))
    return write_section(render_results(results, len(scenarios), extra), RESULTS_BEGIN, RESULTS_END)
