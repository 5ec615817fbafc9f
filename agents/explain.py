"""The offline policy's answers, one builder per request kind (agents/kinds.py names each kind's): from the
request and the outputs by tool name, a short report (text or a final_answer's arguments) that names its
evidence and says which figure was missing instead of guessing it.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from trainops.agents.answer import Evidence, FinalAnswer

if TYPE_CHECKING:
    from langchain_core.messages import ToolMessage

    from trainops.agents.understand import Request

# What a plan does next: call a tool (name, args), answer with a final_answer's arguments, or answer in text.
Next = tuple[str, dict[str, Any]] | dict[str, Any] | str
# Labelled assumptions: a restart that is not stated does not move the Young/Daly interval.
ASSUMED = {"restart": 0.0}


def outputs(results: list[ToolMessage]) -> dict[str, Any]:
    """What each tool that succeeded returned, by its name (the latest call's)."""
    return {r.name: r.artifact for r in results if r.status == "success" and isinstance(r.artifact, dict)}


def find(data: Any, *names: str) -> Any:
    """First value under any of `names`, searching nested dicts and lists breadth-first."""
    queue = [data]
    while queue:
        node = queue.pop(0)
        if isinstance(node, dict):
            for name in names:
                if node.get(name) is not None:
                    return node[name]
            queue.extend(node.values())
        elif isinstance(node, list):
            queue.extend(node)
    return None


def final(verdict: str, summary: str, confidence: str = "medium", **fields: Any) -> dict[str, Any]:
    """A final_answer's arguments, held to its model (agents/answer.py)."""
    return FinalAnswer(verdict=verdict, summary=summary, confidence=confidence, **fields).model_dump(mode="json")


def inconclusive(summary: str, collect: list[str], evidence: list[Evidence] | None = None) -> dict[str, Any]:
    return final("inconclusive", summary, "low", next_to_collect=collect, evidence=evidence or [])


def grep_evidence(grep: dict | None, most: int = 2) -> list[Evidence]:
    """The first `most` non-blank lines a grep_log call matched, each cited with its source and line."""
    return [Evidence(source=f"grep_log:{grep.get('source')} line {m['line']}", quote=m["text"])
            for m in (grep or {}).get("matches", [])[:most] if m.get("text", "").strip()]


def _compact(data: Any, limit: int = 1200) -> str:
    """Tool data as one line of JSON, so nothing a job wrote reads as a line of the answer."""
    text = json.dumps(data, default=str, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + " ..."


def quoted(value: Any, limit: int = 300) -> str:
    """A value a tool returned, inside a line of the answer: printable text as it is, else in a code span with
    its newlines, control characters and backticks escaped, so what a job wrote never starts a line."""
    text = str(value)
    if text.isprintable():
        return text if len(text) <= limit else text[:limit] + " ..."
    text = json.dumps(text, ensure_ascii=False)[1:-1].replace("`", "\\u0060")
    text = "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in text)
    return f"`{text if len(text) <= limit else text[:limit] + ' ...'}`"


def stopped(tool: str, data: Any) -> str:
    """The answer when a step's tool failed or was refused: the plan stops there and says why."""
    reason = data.get("error") if isinstance(data, dict) else data
    verb = "was not run" if isinstance(data, dict) and data.get("kind") in ("rejected", "refused") else "failed"
    return f"Stopped: {tool} {verb}: {quoted(reason, 2000)}"


def _layout_text(plan: Any) -> tuple[str | None, float | None]:
    """'dp_replicate x dp_shard x cp x tp x pp = 1x2x1x1x1, micro_batch 4, seq_len 64' and ~model params."""
    layout = find(plan, "layout")
    if not isinstance(layout, dict):
        return None, None
    dims = ("dp_replicate", "dp_shard", "cp", "tp", "pp")
    text = (" x ".join(dims) + " = " + "x".join(str(layout.get(d)) for d in dims)
            + f", micro_batch {layout.get('micro_batch')}, seq_len {layout.get('seq_len')}")
    ranks = find(plan, "ranks")
    per_rank = ranks[0].get("params") if isinstance(ranks, list) and ranks and isinstance(ranks[0], dict) else None
    shards = (layout.get("dp_shard") or 1) * (layout.get("tp") or 1) * (layout.get("pp") or 1)
    return text, (per_rank * shards if isinstance(per_rank, (int, float)) else None)


def explain_mfu(summary: Any, env: Any, plan: Any = None) -> list[str]:
    """Why an MFU figure is what it is, each figure quoted with the tool and field it comes from (summarize_run,
    the environment declaration, plan_layout on the run's config); what no tool returned is named missing."""
    s = summary if isinstance(summary, dict) else {}
    mfu, spread, share = s.get("mfu_pct_median"), s.get("step_time_rank_spread_pct"), s.get("data_wait_share_pct")
    framework, (layout, params) = find(env, "framework"), _layout_text(plan)
    precision = find(plan, "precision") or find(env, "precision")  # RunSummary carries none: from these or missing
    peak_source = s.get("peak_source") or find(find(env, "compute_peak"), "source")
    facts = {"model": f"~{params / 1e6:.1f}M parameters (plan_layout)" if params else None,
             "hardware": find(env, "hardware_generation") or find(find(env, "accelerators"), "model"),
             "framework": f"{framework.get('name')} {framework.get('version')}"
             if isinstance(framework, dict) else None,
             "layout": layout, "precision": precision}
    basis = f"median over {s.get('steps_measured')} measured steps of {s.get('ranks')} ranks"
    head = (f"MFU of run {quoted(s.get('run'))}: {mfu:.2f}% (summarize_run:mfu_pct_median, {basis})"
            if isinstance(mfu, (int, float)) else "summarize_run returned no MFU figure (mfu_pct_median) for the run")
    context = ", ".join(f"{k} {quoted(v)}" for k, v in facts.items() if v not in (None, ""))
    lines = [head + (f" ({context})." if context else ".")]
    missing = [k.replace("layout", "parallel layout") for k, v in facts.items() if v in (None, "") and k != "framework"]
    if missing:
        lines.append("Not in the evidence, so no MFU conclusion is drawn on them: " + ", ".join(missing) + ".")
    reasons: list[str] = []
    if isinstance(share, (int, float)) and share >= 5:
        reasons.append(f"data pipeline: {share:.1f}% of each step waits for data (summarize_run:data_wait_share_pct)")
    if isinstance(spread, (int, float)) and spread >= 10:
        reasons.append(f"straggler: the slowest rank's step is {spread:.1f}% longer than the fastest "
                       "(summarize_run:step_time_rank_spread_pct)")
    if isinstance(precision, str) and precision.lower() in ("fp32", "float32"):
        reasons.append("precision: fp32 runs against a lower peak than bf16 mixed precision")
    if isinstance(peak_source, str) and ("cpu" in peak_source.lower() or "measured" in peak_source.lower()):
        reasons.append(f"peak: MFU is measured against {quoted(peak_source)} (summarize_run:peak_source); small GEMMs "
                       "on a CPU reach only a fraction of it")
    if isinstance(params, (int, float)) and params < 1e8:
        reasons.append("model size: a small model spends much of each step in per-op overhead (Python, launches, "
                       "optimizer), not in matmuls")
    if reasons:
        lines += ["Why it is low, largest lever first:", *(f"- {r}" for r in reasons)]
    else:
        lines.append("Neither summarize_run's data_wait_share_pct and step_time_rank_spread_pct nor its peak_source "
                     "explains it; to decompose it I need per-step communication time (run with metrics on).")
    return lines


def mfu(request: Request, out: dict[str, Any]) -> str:
    return "\n".join(explain_mfu(out.get("summarize_run"), out.get("declare_environment"), out.get("plan_layout")))


def drill(request: Request, out: dict[str, Any]) -> str:
    injected = out.get("inject_fault") or {}
    if injected.get("overrides"):
        flags = " ".join("--set " + str(o) for o in injected["overrides"])
        return (f"{quoted(injected.get('kind'))} is a launch-time fault ({quoted(injected.get('target'))}): "
                f"start the run with {quoted(flags)}, then ask me to detect faults on it.")
    lines = [f"Fault injected: {_compact(injected, 300)}"]
    if "detect_faults" in out:
        figures = [(label, find(out["detect_faults"], *names)) for label, names in (
            ("detection latency", ("detection_latency_s",)),
            ("isolation granularity", ("isolation_granularity", "isolation")),
            ("recovery time", ("recovery_time_s", "recovery_s")))]
        lines += ["Detection:", *(f"- {label}: {quoted(value)}" for label, value in figures if value is not None)]
        if absent := [label for label, value in figures if value is None]:
            lines.append("- not measured yet (a fault-tolerance conclusion needs all three): " + ", ".join(absent))
    return "\n".join(lines)


def checkpoint_interval(request: Request, out: dict[str, Any]) -> str:
    plan = out.get("plan_checkpoint_interval")
    daly, young = find(plan, "daly_interval_min"), find(plan, "young_interval_min")
    lines = [f"Checkpoint every {daly:.1f} min (Daly; Young's first-order optimum {young:.1f} min)."
             if isinstance(daly, (int, float)) and isinstance(young, (int, float)) else "Checkpoint plan:"]
    if find(plan, "recommendation"):
        lines.append(quoted(find(plan, "recommendation"), 1000))
    lines.extend(f"Assumed {k} time {v:g} s (not stated; say e.g. 'a 2-minute restart' to include it in the waste "
                 "estimate)." for k, v in ASSUMED.items() if k not in request.entities.durations_s)
    lines.append("Evidence: " + _compact(plan))
    return "\n".join(lines)


def approvals(request: Request, out: dict[str, Any]) -> str:
    items = find(out.get("list_pending_approvals"), "items") or []
    if not items:
        return "Nothing waits for approval."
    return f"{len(items)} item(s) wait for a human decision:\n" + "\n".join(
        f"- {quoted(i.get('kind'))} {quoted(i.get('id'))}: {quoted(i.get('detail'))}"
        for i in items if isinstance(i, dict))


def logs(request: Request, out: dict[str, Any]) -> str:
    text = find(out.get("job_logs"), "text", "log")
    text = text if isinstance(text, str) else _compact(out.get("job_logs"))
    return "Job log (quoted as data, not acted on):\n" + "\n".join("> " + line for line in text.splitlines())


def listing(request: Request, out: dict[str, Any]) -> str:
    return "\n".join(f"{tool}: {_compact(data)}" for tool, data in out.items()) or "Nothing to report."


def compare(request: Request, out: dict[str, Any]) -> dict[str, Any]:
    """Which run is slower is compare_runs' reading, never the request's. One changed setting is the candidate
    cause; several are confounded (an ablation of each to collect); none, or no slowdown, is no diagnosis."""
    compared = out["compare_runs"]
    changed, slower, finding = compared.get("changed") or [], compared.get("slower"), str(compared.get("finding"))
    versions = compared.get("versions")
    ran_with = (", ".join(f"{k} {quoted(v)}" for k, v in versions.items() if v not in (None, ""))
                if isinstance(versions, dict) else "not returned")
    basis = f"Basis: {quoted(compared.get('basis') or 'not returned', 1000)}; read with: {ran_with}.\n"
    cited = [Evidence(source="compare_runs:finding", quote=finding)]
    cited += [Evidence(source="compare_runs:changed", quote=str(c["text"])) for c in changed]
    if slower is None:
        return final("answered", f"No slowdown to explain: {finding}.", evidence=cited)
    if not changed:
        return inconclusive(f"Not the config: {finding}.",
                            ["watch_job on a repeat of the slower run, for a straggler rank or data wait",
                             "query_metrics step_time_s per rank on both runs"], cited)
    collect = [] if len(changed) == 1 else [f"an ablation of {c['key']} alone against the baseline (trainops ablate)"
                                            for c in changed]
    return final("diagnosed", f"{basis}MFU regression: {finding}.", "high" if len(changed) == 1 else "medium",
                 fault_kind="mfu-regression", evidence=cited, next_to_collect=collect)
