"""The report's content, decided once: sections, tables and figures built from an `EvidencePack`.
Both templates (report.md.j2 and report.html.j2) render this view, so the Markdown and the HTML
report can never say different things; they differ only in layout."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Literal

from trainops.skills.evidence import figures as pack_figures
from trainops.skills.evidence.bottleneck import BottleneckSplit
from trainops.skills.evidence.model import (
    AblationRow,
    CheckpointPlan,
    EvidencePack,
    MetricSpread,
    PackFigure,
    ReliabilitySummary,
)
from trainops.terminal_text import visible

CellKind = Literal["text", "number", "code", "command", "path", "gain", "regression", "within-noise", "bad"]
Align = Literal["left", "right"]

DECISION_COMMANDS = {
    "approve": 'trainops approve {pack_id} --note "approved as reported"',
    "reject": 'trainops reject {pack_id} --note "your reason"',
}
"""What the reviewer types. tests/skills/test_evidence_pack.py parses both with the real CLI, so a
renamed option fails a test instead of shipping a report whose command no longer works."""

SIGNING_NOTE = ("Both sign the decision with your SSH approver key: the first ssh-agent key listed in the "
                "allowed-signers file, or the one you pass with --key.")


@dataclass(frozen=True)
class Cell:
    """One table cell: its text and what it is, so a template can align, colour or wrap it."""

    text: str
    kind: CellKind = "text"

    @property
    def align(self) -> Align:
        return "right" if self.kind in ("number", "gain", "regression", "within-noise") else "left"


@dataclass(frozen=True)
class Table:
    headers: list[str]
    rows: list[list[Cell]]
    beneath: tuple[int, ...] = ()
    """Columns of long commands and paths that the HTML shows on a full-width line under their
    row, so they wrap at the page's width instead of squeezing every other column."""

    @property
    def aligns(self) -> list[Align]:
        """A column is right-aligned when it holds numbers."""
        return ["right" if any(row[i].align == "right" for row in self.rows) else "left"
                for i in range(len(self.headers))]

    @property
    def inline(self) -> list[int]:
        return [i for i in range(len(self.headers)) if i not in self.beneath]


@dataclass(frozen=True)
class Figure:
    """A plot placed in its section; the caption says what the reader should look at."""

    section: str
    name: str
    caption: str
    png: bytes = field(repr=False)


@dataclass
class Section:
    key: str
    title: str
    paragraphs: list[str] = field(default_factory=list)
    """Markdown prose; run-derived text goes in as `text` (escaped) or `code` (a code span), never raw."""
    tables: list[Table] = field(default_factory=list)
    bullets: list[str] = field(default_factory=list)
    """Markdown list items, built like `paragraphs`."""
    figures: list[Figure] = field(default_factory=list)


@dataclass
class ReportView:
    pack_id: str
    created: str
    verdict: str
    blockers: list[str]
    awaiting: list[str]
    """Plain text from the pack, like the blockers: each template escapes it its own way."""
    commands: dict[str, str]
    sections: list[Section]
    signing_note: str = SIGNING_NOTE

    @property
    def verdict_line(self) -> str:
        """The Markdown report's first line; the blockers are escaped, so none can add a line."""
        blockers = "; ".join(md_text(b) for b in self.blockers) if self.blockers else "none"
        return f"Verdict: {self.verdict.upper()} — blockers: {blockers}"


_MD_INLINE = re.compile(r"[\\`*~|&<#\[]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_MD_LEADING = re.compile(r"^(?:([-+=>])|(\d+)([.)]))")


def md_text(value: object) -> str:
    """Run-derived text for Markdown prose, a list item or a table cell, inert: on one line (a line
    break could start a heading), control and bidi characters shown as escapes, and every character
    that opens Markdown syntax backslash-escaped (CommonMark makes an escaped punctuation character
    literal), so a `peak_source` cannot add a "Verdict: PASS" heading, a link or emphasis. A `]`
    or a `>` opens nothing once every `[` and `<` is escaped; they stay, so R-OUT-2 still sees a
    `[placeholder]` or a `<value>` in the rendered report."""
    line = visible(" ".join(str(value).split()))
    line = _MD_INLINE.sub(lambda m: "\\" + m.group(), line)
    return _MD_LEADING.sub(lambda m: f"\\{m.group(1)}" if m.group(1) else f"{m.group(2)}\\{m.group(3)}", line)


def code(value: object) -> str:
    """A Markdown code span that survives any backticks inside the value (CommonMark's rule)."""
    text = visible(" ".join(str(value).split()))
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def number(value: float | None, digits: int = 2, unit: str = "") -> Cell:
    if value is None:
        return Cell("not measured")
    return Cell(f"{value:,.{digits}f}{unit}", "number")


def _spread_row(name: str, unit: str, metric: MetricSpread, digits: int) -> list[Cell]:
    return [Cell(name), number(metric.median, digits, unit), number(metric.low, digits, unit),
            number(metric.high, digits, unit), number(metric.spread_pct, 1, "%")]


def change_cell(row: AblationRow) -> Cell:
    """The MFU change with its noise band beside it and a mark a reader sees without reading."""
    mark = {"gain": "▲", "regression": "▼", "within-noise": "≈"}[row.verdict]
    return Cell(f"{mark} {row.mfu_change_pct:+.1f}% ± {row.noise_band_pct:.1f}%", row.verdict)


def _figures(figures: dict[str, PackFigure]) -> Section | None:
    """The figures table: each figure once, with its value, evidence level, definition and method."""
    if not figures:
        return None
    rows = [[Cell(f.name), Cell(f.shown, "number"), Cell(f.level), Cell(f.definition), Cell(f.method)]
            for f in figures.values()]
    return Section("figures", "Figures, each defined once", paragraphs=[
        "Every figure the report quotes, with its one value and its evidence level: measured, derived from measured "
        "figures, given on the command line (declared), or an assumed default. The sections below quote these by "
        "name."],
        tables=[Table(["figure", "value", "evidence level", "definition", "how it was obtained"], rows,
                      beneath=(3, 4))])


def _environment(pack: EvidencePack, figures: dict[str, PackFigure]) -> Section | None:
    env = pack.environment
    if env is None:
        return None
    rows = env.declared_rows()
    probe = (f"{pack_figures.quote(figures, 'storage probe write bandwidth').capitalize()}: the probe's small test "
             "file, not a training checkpoint (that is checkpoint write bandwidth, from the drill's saves).")
    return Section("s1", "S1 Environment", paragraphs=[probe, *_since_approved(pack)],
                   tables=[Table(["declared", "value"], [[Cell(k), Cell(v)] for k, v in rows])])


def _since_approved(pack: EvidencePack) -> list[str]:
    """K-IN-3: versions changed since the newest approved pack, and people's known issues, quoted."""
    lines = []
    if pack.since_approved and pack.since_approved.pack:
        moved = "; ".join(f"{c.component} {c.before} -> {c.after}" for c in pack.since_approved.changes)
        lines.append(f"Since the newest approved pack {code(pack.since_approved.pack)}: " + (
            f"{md_text(moved)}; its figures were measured in another environment." if moved else "no version changed."))
    return lines + [f"Known issue of {md_text(i.component)} {md_text(i.versions)} (noted by {md_text(i.added_by)}): "
                    f"{md_text(i.text)}" for i in pack.known_issues]


def _baseline(pack: EvidencePack, figures: dict[str, PackFigure]) -> Section | None:
    base = pack.baseline
    if base is None:
        return None
    comm = (f"{pack_figures.quote(figures, 'communication time')}, of which "
            f"{pack_figures.quote(figures, 'exposed communication')} (not hidden behind compute)")
    about = [f"{_count(base.labels.parameters)} parameters"] if base.labels and base.labels.parameters else []
    size = f" ({'; '.join([*about, md_text(base.labels.structure())])})" if base.labels else ""
    intro = (f"{code(base.model)}{size}, layout {code(base.parallel_layout)}, {md_text(base.precision)}, "
             f"{base.repeats} repeats, the first {base.warmup_steps_excluded} steps of each excluded; "
             f"peak FLOP/s from {md_text(base.peak_source)}.")
    table = Table(["metric", "median", "low", "high", "spread (noise band)"], [
        _spread_row("step time", " s", base.step_time_s, 4),
        _spread_row("throughput", " tokens/s", base.tokens_per_s, 0),
        _spread_row("MFU", "%", base.mfu_pct, 3),
    ])
    return Section("s2", "S2 Baseline", paragraphs=[
        intro, f"{pack_figures.quote(figures, 'data wait').capitalize()}. {comm.capitalize()}; definitions under "
               "Figures.", *_reliability(base.reliability, figures)],
                   tables=[table, *_bottleneck(base.bottleneck)],
                   bullets=[f"repeat {i}: {code(run)}" for i, run in enumerate(base.run_dirs, 1)])


def _reliability(rel: ReliabilitySummary | None, figures: dict[str, PackFigure]) -> list[str]:
    """S2's interruption rate, MTBF and recovery time from the interruption record, the MTBF's
    source beside it (declared or an assumed default only while the record is too short)."""
    if rel is None:
        return ["**Reliability.** not measured: the interruption record was not read for this pack."]
    rate = pack_figures.quote(figures, "interruption rate", "not measured (fewer than two unplanned interruptions)")
    if rel.interruption_rate_per_day is not None:
        rate += f" over {rel.span_h:g} h"
    recovery = pack_figures.quote(figures, "time lost per interruption", "not measured (no unplanned interruption)")
    kind = {"measured": "", "declared": "; the declared figure, not measured",
            "assumed default": "; an assumed default, not measured"}[rel.mtbf_level]
    causes = ", ".join(f"{md_text(cause)} {count}" for cause, count in rel.cause_distribution.items())
    ettr = ", ".join(f"{v:.1f}%" for v in rel.ettr_pct) or "no closed window yet"
    return [f"**Reliability** (interruption record, {rel.interruptions} interruption(s), {rel.unplanned} unplanned). "
            f"{rate.capitalize()}. {pack_figures.quote(figures, 'MTBF')} ({md_text(rel.mtbf_source)}{kind}). "
            f"{recovery.capitalize()}. Causes: {causes}.",
            f"**Effective training time** per {rel.ettr_window_s:g} s window, oldest first: {ettr}."]


def _bottleneck(split: BottleneckSplit | None) -> list[Table]:
    """The split of wall time, each class with its method, and the remainder they leave."""
    if split is None:
        return []
    rows = [("compute", split.compute), ("exposed communication", split.communication),
            ("data loading", split.data_loading), ("scheduling fragmentation (queue wait)", split.scheduling),
            ("process start-up and shut-down", split.startup),
            ("remainder", split.remainder)]
    return [Table(["where the wall time went (wall-time share of ...)", "share of wall time", "seconds", "method"],
                  [[Cell(name), number(share.share_pct, 1, "%"), number(share.seconds, 2, " s"), Cell(share.method)]
                   for name, share in rows])]


def _ablations(pack: EvidencePack) -> Section | None:
    if not pack.ablations:
        return None
    rows = []
    for r in pack.ablations:
        verdict = r.verdict + (", gain gone: ladder stopped and rolled back" if r.stop else
                               ", vanished at target scale" if r.vanished_at_scale else "")
        rows.append([Cell(r.knob, "code"), Cell(f"{r.value} (baseline {r.baseline_value})", "code"), Cell(r.category),
                     Cell(f"{r.scale} [{r.scale_kind}]"), change_cell(r),
                     _scaling(r),
                     Cell(verdict, "bad" if r.vanished_at_scale else r.verdict), Cell(r.source_run, "path")])
    table = Table(["knob", "value", "category", "scale", "MFU change ± noise band", "weak-scaling efficiency",
                   "verdict", "source run"], rows, beneath=(7,))
    design = [Table(["rank", "arm", "acts on", "saves at most", "why"], [
        [Cell(str(a.rank), "number"), Cell(a.arm, "code"), Cell(a.figure.text),
         Cell("none, costs speed") if a.category == "memory" else number(a.bound_pct, 1, "%"), Cell(a.reason)]
        for a in pack.ablation_design], beneath=(4,))] if pack.ablation_design else []
    return Section("s3", "S3/S4 Ablations, one variable per arm", tables=[*design, table], paragraphs=[
        *(["S3 ranks the arms by the most step time each could save, from the baseline's measured split "
           "(Amdahl); S4 runs them in that order, and the table after it holds the arms that ran."] if design else []),
        "A change counts only beyond the run-to-run noise band measured at the same scale: "
        "▲ gain, ▼ regression, ≈ within noise."],
        bullets=_reference_lines(pack.ablations, pack.references) + _ladder_lines(pack.ablations))


def _reference_lines(rows: list[AblationRow], pack_references: list[str]) -> list[str]:
    """Each arm against the published breakdown; a 'not comparable' line once, however many arms share
    it, and not at all when S7 already says it."""
    lines, seen = [], set(pack_references)
    for r in (r for r in rows if r.reference):
        if " not comparable " in r.reference:
            if r.reference not in seen:
                lines.append(f"Published breakdown: {md_text(r.reference)}")
            seen.add(r.reference)
        else:
            lines.append(f"{code(f'{r.knob}={r.value}')} against the published breakdown: {md_text(r.reference)}")
    return lines


def _ladder_lines(rows: list[AblationRow]) -> list[str]:
    """Each ladder's start note and stop: where and why, the rollback, its verification, the human item."""
    lines = [f"{code(r.knob)}: {md_text(r.ladder_note)}" for r in rows if r.ladder_note]
    for r in (r for r in rows if r.stop):
        stop = r.stop
        verified = "matched" if stop.verification_matches else "did NOT match"
        lines.append(f"{code(f'{r.knob}={r.value}')} stopped: {md_text(stop.reason)}; probable cause: "
                     f"{md_text(stop.topology_hint)}; rolled back to {code(f'{r.knob}={stop.reverted_to}')}, whose "
                     f"verification run {verified} the baseline ({stop.verification_change_pct:+.1f}% against "
                     f"±{stop.verification_band_pct:.1f}%); handed to a human: {md_text(stop.human_item)}")
    return lines


def _count(n: int) -> str:
    """A parameter count with its unit, as the report's text rules want it (0.85M, 8B)."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _scaling(row: AblationRow) -> Cell:
    """A target row's weak-scaling efficiency with the global batches it rests on."""
    if row.scale_kind != "target":
        return Cell("—", "number")
    cell = number(row.weak_scaling_efficiency_pct, 0, "%")
    return Cell(f"{cell.text} ({row.scaling_basis})", "text") if row.scaling_basis else cell


def _drills(pack: EvidencePack, figures: dict[str, PackFigure]) -> Section | None:
    ft = pack.fault_tolerance
    if not ft:
        return None
    rows = [[Cell(d.fault, "code"), number(d.detection_latency_s, 3, " s"), Cell(d.isolation_granularity),
             number(d.recovery_time_s, 1, " s"), number(d.steps_lost, 0), Cell(d.checkpoint_used, "path"),
             Cell("yes") if d.async_checkpoint_intact else Cell("NO: failed verification", "bad"),
             Cell(f"injected by trainops; evidence reads {d.cause}"),
             Cell(d.detector), Cell(d.drill_record, "path")] for d in ft.drills]
    table = Table(["fault", "detection latency", "isolation", "recovery time", "steps lost", "checkpoint used",
                   "checkpoint intact", "cause", "detector", "drill record"], rows, beneath=(5, 9))
    dist = ", ".join(f"{md_text(cause)} {count}" for cause, count in sorted(ft.cause_distribution.items()))
    section = Section("s5", "S5 Fault drills", tables=[table], paragraphs=[
        f"Every fault here was injected by trainops (its drill record); what the job's evidence alone reads, "
        f"which is how well the detectors would name it unannounced: {dist}."])
    plan = pack.checkpoint_plan
    if plan:
        mtbf = pack_figures.quote(figures, "MTBF used by the checkpoint plan" if "MTBF used by the checkpoint plan"
                                  in figures else "MTBF")
        quoted = [pack_figures.quote(figures, name) for name in (
            "checkpoint save stall", "checkpoint durable write time", "restart time", "Young interval",
            "Daly interval", "expected waste")]
        section.paragraphs.append(
            f"**Checkpoint plan.** Measured: {quoted[0]} and {quoted[1]} per checkpoint, {quoted[2]}; {mtbf} "
            f"({md_text(plan.mtbf_basis)}). {quoted[3].capitalize()}, {quoted[4]}, {quoted[5]}. "
            f"Recommendation: {md_text(plan.recommendation)}.")
        section.paragraphs.append(_occupancy(plan, figures))
    return section


def _occupancy(plan: CheckpointPlan, figures: dict[str, PackFigure]) -> str:
    """The plan's load on storage: checkpoint bytes per interval over the checkpoint write bandwidth."""
    names = ("checkpoint size", "checkpoint write bandwidth", "Daly interval", "checkpoint write-bandwidth occupancy")
    if plan.write_occupancy_pct is None or any(name not in figures for name in names):
        return ("**Write-bandwidth occupancy.** not measured: the drill run journalled no checkpoint size and "
                "write time")
    size, bandwidth, interval, occupancy = (figures[name].shown for name in names)
    return (f"**Write-bandwidth occupancy.** {size} per checkpoint at the measured checkpoint write bandwidth "
            f"{bandwidth}, once per {interval}: the checkpoints occupy {occupancy}.")


def _layout_plan(pack: EvidencePack) -> Section | None:
    plan = pack.layout_plan
    if plan is None:
        return None
    intro = (f"World {plan.world_size} over {plan.nodes} node(s), mesh "
             f"{code(' x '.join(f'{k}={v}' for k, v in plan.mesh.items()) or 'not planned')}; topology from "
             f"{md_text(plan.topology_source)}.")
    section = Section("plan", "Parallel-strategy plan (declared topology)", paragraphs=[intro])
    topo = plan.topology
    if plan.error and (topo is None or topo.tp_inside_domain):
        section.paragraphs.append(f"**Not planned.** {md_text(plan.error)}")
    if topo is None:
        return section
    section.paragraphs.append(f"**Cross-domain verdict.** {md_text(topo.verdict)}")
    section.tables.append(Table(["dimension", "degree", "rank stride", "placement"], [
        [Cell(m.dim, "code"), number(m.degree, 0), number(m.stride, 0),
         Cell(m.placement, "bad" if m.dim == "tp" and not topo.tp_inside_domain else "text")] for m in topo.mapping]))
    ep = topo.expert_parallel
    if ep is not None:
        wire = ("not estimated" if ep.all_to_all_s_per_step is None else f"{ep.all_to_all_s_per_step:.4g} s per step")
        section.paragraphs.append(
            f"**Expert parallel (on paper).** {ep.experts} experts, top-{ep.top_k}, ep={ep.ep} ({md_text(ep.ep_basis)}"
            f"; {md_text(ep.placement)}), {ep.moe_layers} MoE layer(s): {ep.all_to_all_bytes_per_step / 2**20:,.1f}"
            f" MiB of all-to-all per rank per step against {md_text(ep.bandwidth_basis)}"
            f"{'' if ep.bandwidth_gbit_s is None else f' ({ep.bandwidth_gbit_s:g} Gbit/s)'}: {wire}. "
            f"{md_text(ep.formula)}")
    return section


def _comparisons(pack: EvidencePack) -> Section | None:
    """S7: the baseline against same-generation MLPerf results and the published breakdowns."""
    if pack.mlperf is None and not pack.references:
        return None
    section = Section("s7", "S7 Comparisons with published results",
                      bullets=[f"Reference: {md_text(ref)}" for ref in pack.references])
    if pack.mlperf is not None:
        m = pack.mlperf
        section.paragraphs.append(f"**MLPerf Training, same generation.** {md_text(m.verdict)}."
                                  + (f" {md_text(m.comparable)}" if m.same_generation else ""))
        if m.same_generation:
            headers = ["round", "benchmark", "submitter", "accelerators", "time to train", "source"]
            section.tables.append(Table(headers, [
                [Cell(r.round), Cell(r.benchmark), Cell(r.submitter), Cell(f"{r.accelerators:,} {r.accelerator}"),
                 number(r.time_to_train_min, 2, " min"), Cell(f"{r.source}: {r.url}", "path")]
                for r in m.same_generation], beneath=(5,)))
    return section


def window(start: float, end: float) -> str:
    """An evidence row's measurement window, start~end in UTC (the date once when both share it)."""
    first = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(start))
    last = time.strftime("%H:%M:%S" if time.gmtime(start)[:3] == time.gmtime(end)[:3] else "%Y-%m-%d %H:%M:%S",
                         time.gmtime(end))
    return f"{first}~{last} UTC"


def _evidence(pack: EvidencePack) -> Section | None:
    if not pack.evidence and not pack.references and not pack.rollback:
        return None
    rows = [[Cell(e.tool, "code"), Cell(e.version), Cell(e.command, "command"), Cell(e.log_path, "path"), Cell(e.value),
             Cell(window(e.window_start, e.window_end))] for e in pack.evidence]
    section = Section("s6", "S6 Evidence", tables=[Table(["tool", "version", "command", "log", "value", "window"], rows,
                                                         beneath=(2, 3))] if rows else [])
    if pack.rollback:
        section.paragraphs.append(f"**Rollback.** {md_text(pack.rollback)}")
    return section


def _change_windows(pack: EvidencePack) -> Section | None:
    """R-CHG-1: the change windows, and every change that landed as an emergency during the runs."""
    note = pack.change_windows
    if note is None:
        return None
    section = Section("chg", "Change windows (R-CHG-1)", paragraphs=[md_text(note.summary)])
    since = "" if note.since is None else f" since {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(note.since))}"
    if not note.emergency_changes:
        section.paragraphs.append(f"No change landed as an emergency{since}.")
        return section
    section.paragraphs.append(f"Changes that landed as an emergency (outside the change windows){since}:")
    section.tables.append(Table(["tool", "landed", "target", "approvers", "input sha256"], [
        [Cell(c.tool, "code"), Cell(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(c.time))), Cell(c.target),
         Cell(", ".join(c.approvers)), Cell(c.input_sha256, "code")] for c in note.emergency_changes], beneath=(4,)))
    return section


def build(pack: EvidencePack, figures: list[Figure] = ()) -> ReportView:
    """The whole report as data; figures go to the section they belong to."""
    table = pack_figures.of(pack)
    sections = [s for s in (_figures(table), _environment(pack, table), _layout_plan(pack), _baseline(pack, table),
                            _ablations(pack), _drills(pack, table), _evidence(pack), _comparisons(pack),
                            _change_windows(pack)) if s]
    by_key = {s.key: s for s in sections}
    for figure in figures:
        if figure.section in by_key:
            by_key[figure.section].figures.append(figure)
    commands = {decision: command.format(pack_id=pack.pack_id) for decision, command in DECISION_COMMANDS.items()}
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(pack.created_time))
    return ReportView(pack_id=pack.pack_id, created=created, verdict=pack.verdict, blockers=list(pack.blockers),
                      awaiting=list(pack.awaiting_human) or ["approve or reject this pack"], commands=commands,
                      sections=sections)
