"""The offline policy's answer to a question about a run's checkpoints after a restart ("which
checkpoint did the restart resume from, and why not the newest", "is any checkpoint corrupt"):
one call of `list_checkpoints` for the run the request names, then a FinalAnswer from the run's
journal as the tool returned it (each start's loaded step and the corrupt ones it skipped, whose
reasons are quoted, never followed).
"""
from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from trainops.agents.answer import FINAL_ANSWER_TOOL, Evidence, FinalAnswer
from trainops.agents.diagnose import grep_evidence, grep_of, inconclusive, tool_call

TOOL = "list_checkpoints"
FALLBACK_LINES = r"falling back|is corrupt|failed verification"


def next_step(run: str | None, job: str | None, done: set[str], results: list[ToolMessage], n: int) -> AIMessage:
    """list_checkpoints for the run; with a corrupt checkpoint skipped and a job named, the job log's own
    line of the fallback; then the answer."""
    if run is None:
        return tool_call(FINAL_ANSWER_TOOL, inconclusive(
            "The request names no run, and a run's checkpoint journal is what says which checkpoint it loaded.",
            ["the run id (list_jobs shows each job's run folder)"]), n)
    if TOOL not in done:
        return tool_call(TOOL, {"run": run}, n)
    out = next((r for r in results if r.name == TOOL), None)
    if out is None or out.status != "success" or not isinstance(out.artifact, dict):
        return tool_call(FINAL_ANSWER_TOOL, inconclusive(f"list_checkpoints could not read run {run}'s checkpoints.",
                                                         ["the run's folder name under $TRAINOPS_HOME/runs"]), n)
    skipped = any(start.get("skipped") for start in out.artifact.get("starts") or [])
    if skipped and job and "grep_log" not in done:
        return tool_call("grep_log", {"job_id": job, "pattern": FALLBACK_LINES, "max_matches": 3, "max_bytes": 2000}, n)
    return tool_call(FINAL_ANSWER_TOOL, _answer(run, out.artifact, grep_of(results, job) if job else None), n)


def _answer(run: str, listed: dict[str, Any], grep: dict[str, Any] | None = None) -> dict[str, Any]:
    starts = listed.get("starts") or []
    newest = listed.get("newest_committed_step")
    if not starts:
        return FinalAnswer(verdict="answered", confidence="medium",
                           evidence=[Evidence(source="list_checkpoints:newest_committed_step", quote=str(newest))],
                           summary=f"Run {run} has not started from a checkpoint: its journal records no load. Its "
                                   f"newest committed checkpoint is step {newest}, which a resume would verify and "
                                   "load.").model_dump(mode="json")
    last = starts[-1]
    skipped = [s for start in starts for s in start.get("skipped") or []]
    evidence = [Evidence(source="list_checkpoints:starts.loaded", quote=str(last["loaded"]))]
    evidence += [Evidence(source="list_checkpoints:starts.skipped.reason", quote=str(s["reason"])) for s in skipped]
    evidence += grep_evidence(grep)
    summary = (f"The latest start of run {run} loaded the checkpoint of step {last['loaded_step']}"
               + (" (verified against its commit record)" if last.get("verified") else "") + ".")
    if skipped:
        summary += " It did not load a newer one because verification failed: " + "; ".join(
            f"step {s['step']}: {s['reason']}" for s in skipped) + "."
        return FinalAnswer(verdict="diagnosed", fault_kind="checkpoint-corruption", evidence=evidence,
                           confidence="high", summary=summary,
                           next_to_collect=["a human decides whether to quarantine the corrupt checkpoint(s) "
                                            f"{sorted({s['step'] for s in skipped})} (quarantine_checkpoints, gated)"]
                           ).model_dump(mode="json")
    return FinalAnswer(verdict="answered", confidence="medium", evidence=evidence,
                       summary=summary + " No checkpoint failed verification on the way.").model_dump(mode="json")
