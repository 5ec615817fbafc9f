"""The offline policy's comparison of two runs ("why is run B slower than run A"): one call of
`compare_runs`, then a FinalAnswer from its fields only.

The baseline is the run named after "than", else the first named (agents/understand.py reads which);
which run is slower, and by how much, is the tool's reading of the metrics, never the request's. One
changed setting is named the candidate cause; several are reported as confounded, with the single-variable ablation that
would separate them as what to collect next; none (or no slowdown) is not a diagnosis.
"""
from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from trainops.agents.answer import FINAL_ANSWER_TOOL, Evidence, FinalAnswer
from trainops.agents.diagnose import inconclusive, tool_call

TOOL = "compare_runs"


def next_step(runs: tuple[str, str], done: set[str], results: list[ToolMessage], n: int) -> AIMessage:
    baseline, candidate = runs
    if TOOL not in done:
        return tool_call(TOOL, {"baseline": baseline, "candidate": candidate}, n)
    out = next((r for r in results if r.name == TOOL), None)
    if out is None or out.status != "success" or not isinstance(out.artifact, dict):
        reason = (out.artifact or {}).get("error") if out is not None and isinstance(out.artifact, dict) else None
        failed = inconclusive(f"compare_runs failed ({reason or 'no output'}).",
                              ["summarize_run on each run", "each run's config.toml"])
        return tool_call(FINAL_ANSWER_TOOL, failed, n)
    return tool_call(FINAL_ANSWER_TOOL, answer_from(out.artifact), n)


def answer_from(compared: dict[str, Any]) -> dict[str, Any]:
    changed, slower, finding = compared.get("changed") or [], compared.get("slower"), str(compared.get("finding"))
    cited = [Evidence(source=f"{TOOL}:finding", quote=finding)]
    cited += [Evidence(source=f"{TOOL}:changed", quote=str(c["text"])) for c in changed]
    if slower is None:
        return FinalAnswer(verdict="answered", confidence="medium", evidence=cited,
                           summary=f"No slowdown to explain: {finding}.").model_dump(mode="json")
    if not changed:
        return inconclusive(f"Not the config: {finding}.",
                             ["watch_job on a repeat of the slower run, for a straggler rank or data wait",
                              "query_metrics step_time_s per rank on both runs"], cited)
    keys = [str(c["key"]) for c in changed]
    collect = [] if len(changed) == 1 else [f"an ablation of {key} alone against the baseline (trainops ablate)"
                                            for key in keys]
    return FinalAnswer(verdict="diagnosed", fault_kind="mfu-regression", evidence=cited, next_to_collect=collect,
                       confidence="high" if len(changed) == 1 else "medium",
                       summary=f"MFU regression: {finding}.").model_dump(mode="json")
