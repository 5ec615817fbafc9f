"""The offline policy's answers: turn tool results into a short report that names its
evidence, and say plainly which figure was missing instead of guessing it.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from langchain_core.messages import ToolMessage


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


def parse_tool_output(message: ToolMessage) -> Any:
    """The data a tool returned: the artifact when present, else the JSON inside the wrapper."""
    if message.artifact is not None:
        return message.artifact
    match = re.search(r"<tool-output[^>]*>\n?(.*)\n?</tool-output>", str(message.content), re.S)
    try:
        return json.loads(match.group(1) if match else str(message.content))
    except json.JSONDecodeError:
        return str(message.content)


def _compact(data: Any, limit: int = 1200) -> str:
    """Tool data as one line of JSON (a string too: quoted, its newlines escaped), so nothing a job
    wrote reads as a line of the answer."""
    text = json.dumps(data, default=str, sort_keys=True)
    return text if len(text) <= limit else text[:limit] + " ..."


def quoted(value: Any, limit: int = 300) -> str:
    """A value a tool returned, as it may appear inside a line of the answer: single-line printable
    text as it is; anything with a newline or control character in a code span, those (and any
    backtick) escaped. What a job wrote (a `peak_source` with "\\nVerdict: PASS") then never starts a line of
    the answer of its own."""
    text = str(value)
    if text.isprintable():
        return text if len(text) <= limit else text[:limit] + " ..."
    text = json.dumps(text, ensure_ascii=False)[1:-1].replace("`", "\\u0060")
    text = "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in text)
    return f"`{text if len(text) <= limit else text[:limit] + ' ...'}`"


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
    """Why an MFU figure is what it is: each figure quoted with the tool and field it comes from
    (summarize_run's RunSummary, the environment declaration, plan_layout on the run's own config);
    what no tool returned is named missing, never guessed."""
    s = summary if isinstance(summary, dict) else {}
    mfu, spread, share = s.get("mfu_pct_median"), s.get("step_time_rank_spread_pct"), s.get("data_wait_share_pct")
    hardware = find(env, "hardware_generation") or find(find(env, "accelerators"), "model")
    framework = find(env, "framework")
    framework = f"{framework.get('name')} {framework.get('version')}" if isinstance(framework, dict) else None
    layout, params = _layout_text(plan)
    model = f"~{params / 1e6:.1f}M parameters (plan_layout)" if params else None
    precision = find(plan, "precision") or find(env, "precision")  # RunSummary carries none: from these or missing
    peak_source = s.get("peak_source") or find(find(env, "compute_peak"), "source")
    basis = f"median over {s.get('steps_measured')} measured steps of {s.get('ranks')} ranks"
    head = (f"MFU of run {quoted(s.get('run'))}: {mfu:.2f}% (summarize_run:mfu_pct_median, {basis})"
            if isinstance(mfu, (int, float)) else "summarize_run returned no MFU figure (mfu_pct_median) for the run")
    facts = (("model", model), ("hardware", hardware), ("framework", framework), ("layout", layout),
             ("precision", precision))
    context = ", ".join(f"{k} {quoted(v)}" for k, v in facts if v not in (None, ""))
    lines = [head + (f" ({context})." if context else ".")]
    missing = [k for k, v in (("model", model), ("hardware", hardware), ("parallel layout", layout),
                              ("precision", precision)) if v in (None, "")]
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
        lines.append("Why it is low, largest lever first:")
        lines.extend(f"- {r}" for r in reasons)
    else:
        lines.append("Neither summarize_run's data_wait_share_pct and step_time_rank_spread_pct nor its peak_source "
                     "explains it; to decompose it I need per-step communication time (run with metrics on).")
    return lines


def _fault_lines(data: Any) -> list[str]:
    figures = [(label, find(data, *names)) for label, names in (
        ("detection latency", ("detection_latency_s",)),
        ("isolation granularity", ("isolation_granularity", "isolation")),
        ("recovery time", ("recovery_time_s", "recovery_s")))]
    lines = [f"- {label}: {quoted(value)}" for label, value in figures if value is not None]
    absent = [label for label, value in figures if value is None]
    if absent:
        lines.append("- not measured yet (a fault-tolerance conclusion needs all three): " + ", ".join(absent))
    return lines


def render_answer(intent: str, request: str, results: list[ToolMessage], assumed: dict | None = None) -> str:
    failed = [r for r in results if r.status == "error"]
    if failed:
        first = failed[0]
        data = parse_tool_output(first)
        reason = data.get("error") if isinstance(data, dict) else data
        verb = "was not run" if isinstance(data, dict) and data.get("kind") in ("rejected", "refused") else "failed"
        return f"Stopped: {first.name} {verb}: {quoted(reason, 2000)}"
    by_tool = {r.name: parse_tool_output(r) for r in results}
    if intent == "mfu":
        return "\n".join(explain_mfu(by_tool.get("summarize_run"), by_tool.get("declare_environment"),
                                      by_tool.get("plan_layout")))
    if intent == "drill":
        injected = by_tool.get("inject_fault") or {}
        if isinstance(injected, dict) and injected.get("overrides"):
            flags = " ".join("--set " + str(o) for o in injected["overrides"])
            return (f"{quoted(injected.get('kind'))} is a launch-time fault ({quoted(injected.get('target'))}): "
                    f"start the run with {quoted(flags)}, then ask me to detect faults on it.")
        lines = [f"Fault injected: {_compact(injected, 300)}"]
        if "detect_faults" in by_tool:
            lines.append("Detection:")
            lines.extend(_fault_lines(by_tool["detect_faults"]))
        return "\n".join(lines)
    if intent == "checkpoint":
        plan = by_tool.get("plan_checkpoint_interval")
        daly, young = find(plan, "daly_interval_min"), find(plan, "young_interval_min")
        head = (f"Checkpoint every {daly:.1f} min (Daly; Young's first-order optimum {young:.1f} min)."
                if isinstance(daly, (int, float)) and isinstance(young, (int, float)) else "Checkpoint plan:")
        lines = [head]
        if find(plan, "recommendation"):
            lines.append(quoted(find(plan, "recommendation"), 1000))
        lines.extend(f"Assumed {k} time {v:g} s (not stated; say e.g. 'a 2-minute restart' to include it in the waste "
                     "estimate)."
                     for k, v in (assumed or {}).items() if k == "restart")
        lines.append("Evidence: " + _compact(plan))
        return "\n".join(lines)
    if intent == "sop":
        result = by_tool.get("run_sop") or {}
        blockers = result.get("blockers") or []
        pack = Path(str(result.get("pack_dir"))).name
        return "\n".join([
            f"Verdict: {quoted(result.get('verdict'))}"
            + (f"; blockers: {'; '.join(quoted(b) for b in blockers)}" if blockers else ""),
            f"Evidence pack: {quoted(result.get('pack_dir'))} (SOP took {result.get('elapsed_s', 0):.0f} s).",
            f"A human decides it: trainops approve {quoted(pack)} (signed with their SSH key), or trainops reject "
            f"{quoted(pack)} "
            "--note WHY.",
        ])
    if intent == "approvals":
        items = find(next(iter(by_tool.values()), None), "items") or []
        if not items:
            return "Nothing waits for approval."
        return f"{len(items)} item(s) wait for a human decision:\n" + "\n".join(
            f"- {quoted(i.get('kind'))} {quoted(i.get('id'))}: {quoted(i.get('detail'))}"
            for i in items if isinstance(i, dict))
    if intent == "logs":
        text = find(by_tool.get("job_logs"), "text", "log")
        text = text if isinstance(text, str) else _compact(by_tool.get("job_logs"))
        return "Job log (quoted as data, not acted on):\n" + "\n".join("> " + line for line in text.splitlines())
    return "\n".join(f"{r.name}: {_compact(parse_tool_output(r))}" for r in results) or "Nothing to report."
