"""The pack's figures table: every figure once, with its unit, definition, method and evidence
level, computed from the pack's measurements when it is assembled (and again at approval, R-APR-1).
The report's sections and plots quote `PackFigure.shown`, so one name has one value everywhere.

Two quantities that could pass for one get two names here, each defined against the other:
communication time (all time in collectives) and exposed communication (collectives no compute
hid); a training checkpoint's write bandwidth (the drill's saves) and the storage probe's (S1)."""
from __future__ import annotations

from trainops.skills.evidence.model import EvidenceLevel, EvidencePack, PackFigure

MIB_PER_GIB = 1024


def shown(value: float, unit: str, digits: int) -> str:
    """A value as the report writes it: a percentage takes its sign without a space."""
    text = f"{value:,.{digits}f}"
    return f"{text}{unit}" if unit.startswith("%") else f"{text} {unit}"


class _Table:
    def __init__(self) -> None:
        self.rows: list[PackFigure] = []

    def add(self, section: str, name: str, value: float | None, unit: str, digits: int, definition: str,
            method: str, level: EvidenceLevel) -> None:
        """A figure that was not measured (None) has no row: the section says why in its place."""
        if value is None:
            return
        taken = {f.name for f in self.rows}
        unique, n = name, 2
        while unique in taken:
            unique, n = f"{name} #{n}", n + 1
        self.rows.append(PackFigure(name=unique, value=value, unit=unit, shown=shown(value, unit, digits),
                                    definition=definition, method=method or "not recorded", level=level,
                                    section=section))


def table(pack: EvidencePack) -> list[PackFigure]:
    """Every figure of the pack, in report order (S1, S2, S5)."""
    out = _Table()
    env, base = pack.environment, pack.baseline
    if env is not None and env.checkpoint_write_gib_per_s is not None:
        out.add("s1", "storage probe write bandwidth", env.checkpoint_write_gib_per_s * MIB_PER_GIB, "MiB/s", 1,
                "how fast the S1 environment probe wrote one small test file to the checkpoint storage and made it "
                "durable: the storage's speed for that file, not a training checkpoint's (see checkpoint write "
                "bandwidth)", "declare_environment's checkpoint-storage probe (trainops env)", "measured")
    if base is not None:
        _baseline(out, pack)
    if pack.fault_tolerance:
        for d in pack.fault_tolerance.drills:
            out.add("s5", f"detection latency ({d.fault} drill)", d.detection_latency_s, "s", 3,
                    "injection -> the detector flagged the fault", f"{d.detector}; {d.drill_record}", "measured")
            out.add("s5", f"recovery time ({d.fault} drill)", d.recovery_time_s, "s", 1,
                    "detection -> the first completed step after the restart", d.drill_record, "measured")
    if pack.checkpoint_plan is not None:
        _plan(out, pack)
    return out.rows


def _baseline(out: _Table, pack: EvidencePack) -> None:
    base = pack.baseline
    runs = f"{base.repeats} repeat(s), the first {base.warmup_steps_excluded} steps of each excluded"
    out.add("s2", "step time", base.step_time_s.median, "s", 4,
            "median over the repeats of each repeat's median step time", f"metrics.jsonl step_time_s, {runs}",
            "measured")
    out.add("s2", "step time spread", base.step_time_s.spread_pct, "%", 1,
            "(slowest - fastest repeat) / median step time: the run-to-run noise of step time",
            f"from the repeats' step times, {runs}", "derived")
    out.add("s2", "throughput", base.tokens_per_s.median, "tokens/s", 0, "median over the repeats of tokens per second",
            f"metrics.jsonl tokens_per_s, {runs}", "measured")
    out.add("s2", "MFU", base.mfu_pct.median, "% of peak FLOP/s", 3,
            "model FLOPs per second over the device's peak FLOP/s, median over the repeats",
            f"metrics.jsonl mfu_pct, {runs}; peak from {base.peak_source}", "derived")
    out.add("s2", "MFU spread", base.mfu_pct.spread_pct, "%", 1,
            "(highest - lowest repeat) / median MFU: the noise band an ablation arm is judged against",
            f"from the repeats' MFU, {runs}", "derived")
    out.add("s2", "data wait", base.data_wait_share_pct, "% of step time", 1,
            "time a step waited for its batch over step time, mean over the repeats",
            "metrics.jsonl data_wait_s over step_time_s", "measured")
    out.add("s2", "communication time", base.comm_share_pct, "% of profiled step time", 1,
            "time inside the profiled steps with a collective in progress, whether or not compute ran beside it, "
            "over the profiled step time", base.comm_share_method, "derived")
    out.add("s2", "exposed communication", base.exposed_comm_share_pct, "% of profiled step time", 1,
            "the part of communication time during which no compute ran (what overlap failed to hide), over the "
            "profiled step time; never more than communication time", base.comm_share_method, "derived")
    split = base.bottleneck
    if split is not None:
        for name, share in (("compute", split.compute), ("exposed communication", split.communication),
                            ("data loading", split.data_loading), ("queue wait", split.scheduling),
                            ("process start-up and shut-down", split.startup), ("remainder", split.remainder)):
            out.add("s2", f"wall-time share of {name}", share.share_pct, "% of wall time", 1,
                    f"seconds of {name} summed over the repeats, over their wall time (scheduler submit -> job end, "
                    f"{split.wall_time_s:,.1f} s)", share.method, "derived")
    rel = base.reliability
    if rel is not None:
        out.add("s2", "MTBF", rel.mtbf_h, "h", 1, "mean time between unplanned failures of a job", rel.mtbf_source,
                rel.mtbf_level)
        out.add("s2", "interruption rate", rel.interruption_rate_per_day, "per day", 2,
                "unplanned interruptions per day in the interruption record", f"{rel.unplanned} unplanned "
                "interruption(s) in the workspace's interruption record", "measured")
        out.add("s2", "time lost per interruption", rel.recovery_time_s, "s", 1,
                "median time lost per unplanned interruption in the record (not a drill's recovery time)",
                "the workspace's interruption record", "measured")


def _plan(out: _Table, pack: EvidencePack) -> None:
    plan = pack.checkpoint_plan
    rel = pack.baseline.reliability if pack.baseline else None
    out.add("s5", "checkpoint save stall", plan.save_stall_s, "s", 3,
            "median time training stopped for one checkpoint save", "the drill run's checkpoint journal", "measured")
    out.add("s5", "checkpoint durable write time", plan.write_s, "s", 3,
            "median time for one checkpoint to become durable on storage", "the drill run's checkpoint journal",
            "measured")
    out.add("s5", "restart time", plan.restart_s, "s", 1,
            f"detection -> training again, the restart cost the checkpoint interval is planned with"
            f"{f' ({plan.restart_path})' if plan.restart_path else ''}", plan.restart_source or "the drill",
            "measured")
    if rel is None or rel.mtbf_h != plan.mtbf_h:
        # the typed level; a plan written before it had one claims nothing it cannot show
        level: EvidenceLevel = plan.mtbf_level or "assumed default"
        out.add("s5", "MTBF used by the checkpoint plan", plan.mtbf_h, "h", 1,
                "mean time between failures the checkpoint interval is planned with", plan.mtbf_basis, level)
    out.add("s5", "Young interval", plan.young_interval_min, "min", 1,
            "sqrt(2 x checkpoint cost x MTBF): Young's checkpoint interval", "from the figures above", "derived")
    out.add("s5", "Daly interval", plan.daly_interval_min, "min", 1,
            "Daly's refinement of the Young interval (restart time counted)", "from the figures above", "derived")
    out.add("s5", "expected waste", plan.expected_waste_pct, "% of wall time", 2,
            "expected share of wall time lost to checkpoint saves and to recomputation after failures, checkpointing "
            "at the Daly interval", "Daly's model on the figures above", "derived")
    size = None if plan.checkpoint_bytes is None else plan.checkpoint_bytes / 2**20
    out.add("s5", "checkpoint size", size, "MiB", 1, "median bytes one training checkpoint writes",
            "the drill run's checkpoint journal", "measured")
    out.add("s5", "checkpoint write bandwidth", plan.write_bandwidth_mib_s, "MiB/s", 1,
            "how fast the drill run's own training checkpoints were written: their bytes over their durable-write "
            "time, every rank and file of a save together", "the drill run's checkpoint journal", "measured")
    out.add("s5", "checkpoint write-bandwidth occupancy", plan.write_occupancy_pct, "% of the write bandwidth", 3,
            "checkpoint durable write time per Daly interval over the interval: the share of the checkpoint write "
            "bandwidth the plan occupies", "from the figures above", "derived")


def of(pack: EvidencePack) -> dict[str, PackFigure]:
    """The pack's figures by name: the table it carries, or (a pack built before figures existed,
    or by hand in a test) the table computed now."""
    return {f.name: f for f in (pack.figures or table(pack))}


def quote(figures: dict[str, PackFigure], name: str, missing: str = "not measured") -> str:
    """'name value' as every section writes a figure, or the name and why it has no value."""
    figure = figures.get(name)
    return f"{name} {figure.shown}" if figure else f"{name} {missing}"
