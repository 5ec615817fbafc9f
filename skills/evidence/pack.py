"""Assemble, validate and write evidence packs to `$TRAINOPS_HOME/packs/PACK/`.

Order matters: the pack is validated by its model and by governance (claims and report text)
*before* anything touches the disk, so an invalid pack is never written."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from pydantic import ValidationError

from trainops.run_records import read_metrics
from trainops.skills.escalate import escalation_problems, pack_signals
from trainops.skills.evidence import figures as pack_figures
from trainops.skills.evidence import plots
from trainops.skills.evidence.design import DesignedArm
from trainops.skills.evidence.model import (
    AblationRow,
    BaselineSummary,
    ChangeWindowsNote,
    CheckpointPlan,
    DrillResult,
    EmergencyChange,
    EvidencePack,
    EvidenceRow,
    FaultToleranceReport,
    PackEnvironment,
)
from trainops.skills.evidence.published import LayoutPlan, MlperfComparison
from trainops.skills.evidence.render import to_html, to_markdown
from trainops.skills.evidence.steps import PackChoice, PackStep
from trainops.skills.stats import spread
from trainops.tools.changes import framework, known_issues
from trainops.tools.governance import claims, escalation, windows
from trainops.tools.governance.pack_checks import record_written
from trainops.tools.governance.text import validate_report_text
from trainops.tools.jobs.jobs import summarize_records
from trainops.tools.reliability.interruptions import cause_distribution, read_interruptions
from trainops.tools.versions import SoftwareVersions, current
from trainops.workspace import check_id, packs_dir, run_folder

MIN_REPEATS = 3
"""Repeats per side before a noise band (and so a gain) is trusted enough to pass."""


class PackRefused(ValueError):
    """Governance or the model refused the pack; nothing was written."""
def decide(baseline: BaselineSummary | None, ablations: list[AblationRow],
           drills: list[DrillResult], steps: list[PackStep] = ()) -> tuple[str, list[str]]:
    """Verdict and blockers from the measurements: fail when a recovery broke, partial when a
    part of the SOP is missing, a step's call is not in the audit log as recorded, or no change
    beat the noise; pass otherwise."""
    failures = []
    gaps = [f"step {s.step} ({s.tool}) is not in the audit log as the session records it: {s.note}"
            for s in steps if not s.audited]
    if baseline is None:
        gaps.append("no baseline measured (S2)")
    elif baseline.repeats < MIN_REPEATS:
        gaps.append(f"baseline has {baseline.repeats} repeat(s); {MIN_REPEATS} or more are needed before a noise band "
                    "is trusted (run without --quick)")
    if not ablations:
        gaps.append("no ablation arms run (S3/S4)")
    elif not any(r.verdict == "gain" for r in ablations):
        gaps.append("no ablation arm beat the run-to-run noise band")
    failures += [f"{r.knob}={r.value}: gain at small scale vanished at target scale (stop the rollout, roll back)"
                 for r in ablations if r.vanished_at_scale]
    small_gains = {r.knob for r in ablations if r.scale_kind == "small" and r.verdict == "gain"}
    gaps += [f"{r.knob}={r.value}: small-scale gain not confirmed beyond the noise band at target scale"
             for r in ablations if r.scale_kind == "target" and r.knob in small_gains and r.verdict != "gain"
             and not r.vanished_at_scale]
    if not drills:
        gaps.append("no fault drill run (S5)")
    failures += [f"drill {d.fault}: restored checkpoint {d.checkpoint_used} failed verification"
                 for d in drills if not d.async_checkpoint_intact]
    if failures:
        return "fail", failures + gaps
    return ("partial", gaps) if gaps else ("pass", [])


def drill_causes(drills: list[DrillResult]) -> dict[str, int]:
    """The drills' job ends per cause, from the interruption record (what the evidence said), not
    from which drills ran."""
    ids = {d.interruption_id for d in drills if d.interruption_id}
    return cause_distribution([r for r in read_interruptions() if r.id in ids])


def change_windows_note(runs: list[str]) -> ChangeWindowsNote:
    """R-CHG-1 in the pack: the windows configured now and each change that landed as an emergency
    since the first metrics record of the pack's runs (every one in the log when no run can be read)."""
    starts = []
    for run in runs:
        try:
            records = read_metrics(run_folder(run, "run"))
        except (ValueError, OSError):
            continue
        starts += [r.time for r in records[:1] if r.time > 0]
    since = min(starts) if starts else None
    state = windows.status()
    return ChangeWindowsNote(summary=state["summary"], windows=state["windows"], since=since,
                             emergency_changes=[EmergencyChange(**c) for c in windows.emergency_changes(since)])


def assemble(pack_id: str, environment: PackEnvironment | None, baseline: BaselineSummary | None,
             ablations: list[AblationRow], drills: list[DrillResult], evidence: list[EvidenceRow],
             rollback: str = "", references: list[str] | None = None,
             checkpoint_plan: CheckpointPlan | None = None, mlperf: MlperfComparison | None = None,
             layout_plan: LayoutPlan | None = None, ablation_design: list[DesignedArm] | None = None,
             sop_steps: list[PackStep] = (), choices: list[PackChoice] = ()) -> EvidencePack:
    verdict, blockers = decide(baseline, ablations, drills, list(sop_steps))
    awaiting = ["approve or reject the pack with a signed decision (trainops approve / trainops reject)"]
    awaiting += [f"decide whether to adopt {r.knob}={r.value} at target scale" for r in ablations
                 if r.scale_kind == "target" and r.verdict == "gain"]
    awaiting += [f"confirm isolation of {d.fault}: {d.isolation_granularity}-level" for d in drills
                 if d.isolation_granularity in ("node", "job")]
    report = FaultToleranceReport(drills=drills, cause_distribution=drill_causes(drills)) if drills else None
    runs = [*(baseline.run_dirs if baseline else []), *(r.source_run for r in ablations)]
    return with_figures(EvidencePack(
        pack_id=pack_id, created_time=time.time(), verdict=verdict, blockers=blockers, environment=environment,
        baseline=baseline, ablations=ablations, fault_tolerance=report, evidence=evidence, awaiting_human=awaiting,
        rollback=rollback, references=references or [], checkpoint_plan=checkpoint_plan, mlperf=mlperf,
        layout_plan=layout_plan, change_windows=change_windows_note(runs), versions=run_versions(environment),
        ablation_design=ablation_design or [], sop_steps=list(sop_steps), choices=list(choices),
        **version_history(environment)))


def version_history(environment: PackEnvironment | None) -> dict:
    """K-IN-3: what changed since the newest approved pack, and the known issues of these versions."""
    if environment is None:
        return {}
    versions = known_issues.declared_versions(environment.framework, environment.framework_version,
                                              environment.torch_version, environment.scheduler)
    return {"since_approved": framework.since_approved(versions),
            "known_issues": known_issues.known_issues(versions)}


def run_versions(environment: PackEnvironment | None) -> SoftwareVersions:
    """trainops' version and commit now; torch and the scheduler as the environment declared them."""
    if environment is None:
        return current()
    kind = environment.scheduler.split()[0] if environment.scheduler.split() else "local"
    return current(kind).model_copy(update={"torch": environment.torch_version, "scheduler": environment.scheduler})


def with_figures(pack: EvidencePack) -> EvidencePack:
    """The pack with its figures table computed from its measurements (skills/evidence/figures.py)."""
    return pack.model_copy(update={"figures": pack_figures.table(pack)})


def governance_errors(pack: EvidencePack, markdown: str) -> list[str]:
    """What governance refuses in this pack: the baseline MFU claim (R-ENV-1/2), each drill's
    fault-tolerance conclusion (R-EVD-2), the escalations it hands over (R-ESC-1..4) and the report
    text (R-OUT-1..3). Ablation arms were checked for a single variable (R-ABL-1) when they ran."""
    checks = []
    if pack.baseline and pack.environment:
        b, env = pack.baseline, pack.environment
        checks.append(lambda: claims.MfuClaim(
            model=b.model, hardware_generation=env.hardware, parallel_layout=b.parallel_layout, precision=b.precision,
            framework=env.framework, framework_version=env.framework_version, mfu_pct=b.mfu_pct.median,
            source_run=b.run_dirs[0]))
    for d in pack.fault_tolerance.drills if pack.fault_tolerance else []:
        checks.append(lambda d=d: claims.FaultToleranceConclusion(
            fault=d.fault, detection_latency_s=d.detection_latency_s, isolation_granularity=d.isolation_granularity,
            recovery_time_s=d.recovery_time_s, drill_record=d.drill_record))
    errors: list[str] = []
    for check in checks:
        try:
            check()
        except ValidationError as exc:
            errors += [e["msg"] for e in exc.errors()]
    errors += escalation.report_problems(pack_signals(pack), pack.awaiting_human)  # R-ESC-1..4: action, cause split
    return errors + [str(v) for v in validate_report_text(markdown)]


def derivation_problems(pack: EvidencePack, folder: Path) -> list[str]:
    """R-APR-1 at approval: what the pack says must be what trainops derives again, now, from its
    sources: the verdict and blockers from its measurements, the baseline MFU from the cited runs'
    metrics, both reports from evidence.json. This, not an audit line (anyone who can append to the
    log can append a `pack_written` entry), is what shows a pack was not edited by hand."""
    problems = []
    drills = pack.fault_tolerance.drills if pack.fault_tolerance else []
    verdict, blockers = decide(pack.baseline, pack.ablations, drills, pack.sop_steps)
    if (verdict, blockers) != (pack.verdict, pack.blockers):
        problems.append(f"R-APR-1: evidence.json says verdict {pack.verdict!r} (blockers {pack.blockers}) but its "
                        f"measurements give {verdict!r} (blockers {blockers}): the pack was edited; build a new one")
    problems += _baseline_mfu_problems(pack)
    if pack.figures and pack.figures != pack_figures.table(pack):
        problems.append("R-APR-1: evidence.json's figures table is not the one its measurements give: the pack was "
                        "edited; build a new one")
    problems += [f"R-APR-1: {problem}" for problem in escalation_problems(pack)]
    figures = plots.all_plots(pack)
    for name, text in (("report.md", to_markdown(pack, figures)), ("report.html", to_html(pack, figures))):
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8", errors="replace") != text:
            problems.append(f"R-APR-1: {name} is not the report trainops renders from evidence.json: it was edited "
                            "or replaced; build a new pack")
    return problems


def derivation_notes(pack: EvidencePack) -> list[str]:
    """What approval did not compare, and why: a pack built before the figures table carries none
    (figures == []), so there is no table to re-derive; its reports compute the table from its
    measurements (figures.of)."""
    if pack.figures:
        return []
    return ["evidence.json was built before the figures table: it carries no figures table, so none was compared "
            "(the reports compute it from the pack's measurements)"]


def _baseline_mfu_problems(pack: EvidencePack) -> list[str]:
    """The baseline's MFU median, recomputed from the metrics of the runs it cites."""
    if pack.baseline is None:
        return []
    medians = []
    for run in pack.baseline.run_dirs:
        try:
            summary = summarize_records(run, read_metrics(run_folder(run, "baseline.run_dirs")),
                                        pack.baseline.warmup_steps_excluded)
        except (ValueError, OSError) as exc:
            return [f"R-APR-1: baseline run {run} cannot be re-read ({exc}); keep the run folders with the pack"]
        if summary.mfu_pct_median is not None:
            medians.append(summary.mfu_pct_median)
    measured = spread(medians).median if medians else None
    claimed = pack.baseline.mfu_pct.median
    if measured is None or not math.isclose(measured, claimed, rel_tol=1e-6, abs_tol=1e-9):
        return [f"R-APR-1: evidence.json gives baseline MFU {claimed:g}% but its runs measure "
                f"{'nothing' if measured is None else f'{measured:g}%'}: the pack was edited; build a new one"]
    return []


def write(pack: EvidencePack, packs_root: Path | None = None) -> Path:
    """Validate, then write evidence.json, report.md, report.html and plots. Raises PackRefused.
    The plots are drawn in memory first, so their captions are checked with the report text."""
    check_id("pack", pack.pack_id)
    pack = with_figures(EvidencePack.model_validate(pack.model_dump()))
    figures = plots.all_plots(pack)
    markdown = to_markdown(pack, figures)
    errors = governance_errors(pack, markdown) + escalation_problems(pack)
    if errors:
        raise PackRefused(f"pack {pack.pack_id} refused by governance: " + "; ".join(errors))
    folder = (packs_root or packs_dir()) / pack.pack_id
    if folder.exists():
        raise PackRefused(f"pack {pack.pack_id} already exists at {folder}; packs are immutable, build a new one")
    staging = folder.with_name(f".{pack.pack_id}.partial")
    (staging / "plots").mkdir(parents=True)
    for figure in figures:
        (staging / "plots" / f"{figure.name}.png").write_bytes(figure.png)
    (staging / "evidence.json").write_text(pack.model_dump_json(indent=2) + "\n", encoding="utf-8")
    (staging / "report.md").write_text(markdown, encoding="utf-8")
    (staging / "report.html").write_text(to_html(pack, figures), encoding="utf-8")
    record_written(staging, pack.pack_id)  # audited first: approval checks the pack against this record
    staging.rename(folder)
    return folder


def load(pack_dir: Path) -> EvidencePack:
    return EvidencePack.model_validate(json.loads((Path(pack_dir) / "evidence.json").read_text(encoding="utf-8")))
