"""Markdown and HTML renderings of an evidence pack. The first line is always the verdict and
its blockers, so a reviewer (or a grep) gets the answer before the detail."""
from __future__ import annotations

import base64
import html
from pathlib import Path

from trainops.skills.evidence.model import EvidencePack


def verdict_line(pack: EvidencePack) -> str:
    blockers = "; ".join(pack.blockers) if pack.blockers else "none"
    return f"Verdict: {pack.verdict.upper()} — blockers: {blockers}"


def _table(headers: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def _fmt(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "not measured" if value is None else f"{value:.{digits}f}{unit}"


def to_markdown(pack: EvidencePack) -> str:
    out = [verdict_line(pack), "", f"# Evidence pack {pack.pack_id}", ""]
    env = pack.environment
    if env:
        out += ["## Environment", ""]
        out += _table(
            ["framework", "torch", "hardware", "devices", "backend", "scheduler", "ckpt write GiB/s", "hot spares"],
            [[f"{env.framework} {env.framework_version}", env.torch_version, env.hardware, env.device_count,
              env.backend, env.scheduler, _fmt(env.checkpoint_write_gib_per_s, 3), env.hot_spares]],
        ) + [""]
    base = pack.baseline
    if base:
        out += ["## Baseline", "",
                f"{base.model}, {base.parallel_layout}, {base.precision}, {base.repeats} repeats, "
                f"first {base.warmup_steps_excluded} steps excluded; peak FLOP/s: {base.peak_source}.", ""]
        out += _table(
            ["metric", "median", "low", "high", "spread"],
            [[name, _fmt(m.median, 4), _fmt(m.low, 4), _fmt(m.high, 4), _fmt(m.spread_pct, 1, "%")]
             for name, m in (("step_time_s", base.step_time_s), ("tokens_per_s", base.tokens_per_s), ("mfu_pct", base.mfu_pct))],
        )
        comm = "not measured" if base.comm_share_pct is None else f"{base.comm_share_pct:.1f}% ({base.comm_share_method})"
        out += ["", f"Data-wait share: {base.data_wait_share_pct:.1f}%. Communication share: {comm}.", ""]
    if pack.ablations:
        out += ["## Ablations (one variable per arm)", ""]
        out += _table(
            ["knob", "value (baseline)", "category", "scale", "MFU change", "noise band", "verdict", "source"],
            [[r.knob, f"{r.value} ({r.baseline_value})", r.category, f"{r.scale} [{r.scale_kind}]" + (
                 f", weak-scaling efficiency {r.weak_scaling_efficiency_pct:.0f}%" if r.weak_scaling_efficiency_pct is not None else ""),
              _fmt(r.mfu_change_pct, 1, "%"), f"±{r.noise_band_pct:.1f}%",
              r.verdict + (" — vanished at scale" if r.vanished_at_scale else ""), r.source_run]
             for r in pack.ablations],
        ) + [""]
    ft = pack.fault_tolerance
    if ft:
        out += ["## Fault tolerance", ""]
        out += _table(
            ["fault", "detection latency", "isolation", "recovery time", "steps lost", "checkpoint used", "async ckpt intact", "cause", "detector"],
            [[d.fault, _fmt(d.detection_latency_s, 3, " s"), d.isolation_granularity, _fmt(d.recovery_time_s, 1, " s"),
              d.steps_lost, d.checkpoint_used, "yes" if d.async_checkpoint_intact else "NO", d.cause, d.detector]
             for d in ft.drills],
        )
        dist = ", ".join(f"{k} {v}" for k, v in sorted(ft.cause_distribution.items()))
        out += ["", f"Cause distribution: {dist}.", ""]
    plan = pack.checkpoint_plan
    if plan:
        out += ["## Checkpoint plan", "",
                f"Measured: stall {plan.save_stall_s:.3f} s and durable write {plan.write_s:.3f} s per checkpoint, "
                f"restart {plan.restart_s:.1f} s; MTBF {plan.mtbf_h:g} h ({plan.mtbf_basis}). Young interval "
                f"{plan.young_interval_min:.1f} min, Daly interval {plan.daly_interval_min:.1f} min, expected waste "
                f"{plan.expected_waste_pct:.2f}%. Recommendation: {plan.recommendation}.", ""]
    if pack.evidence:
        out += ["## Evidence", ""]
        out += _table(
            ["tool", "version", "command", "log", "value", "window (s)"],
            [[e.tool, e.version, f"`{e.command}`", e.log_path, e.value, f"{e.window_end - e.window_start:.1f}"] for e in pack.evidence],
        ) + [""]
    if pack.references:
        out += ["## Reference comparison", ""] + [f"- {ref}" for ref in pack.references] + [""]
    if pack.rollback:
        out += ["## Rollback", "", pack.rollback, ""]
    out += ["## Awaiting a human", ""] + [f"- {item}" for item in pack.awaiting_human or ["approve or reject this pack"]]
    return "\n".join(out) + "\n"


def to_html(pack: EvidencePack, plots: list[Path]) -> str:
    """A single self-contained file: the Markdown text plus the plots embedded as PNG data."""
    body = [f"<h1>{html.escape(verdict_line(pack))}</h1>", f"<pre>{html.escape(to_markdown(pack))}</pre>"]
    for plot in plots:
        data = base64.b64encode(plot.read_bytes()).decode("ascii")
        body.append(f'<figure><img alt="{html.escape(plot.stem)}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{html.escape(plot.stem)}</figcaption></figure>")
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(pack.pack_id)}</title></head><body>" + "\n".join(body) + "</body></html>\n")
