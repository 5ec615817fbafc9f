"""The evidence validators a pack must pass before a human may approve it (R-APR-1), and the
decision commands that run them: the pack model, the claims governance checks (R-ENV-1/2,
R-EVD-2, report text) and one variable per ablation arm against the configs the runs actually
used (R-ABL-1). Governance (trainops.tools.governance.approvals) takes these as a parameter, so
the check runs on every approval without the tools layer importing the skills above it."""
from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import ValidationError

from trainops.run_folder import RunFiles
from trainops.skills.evidence.model import EvidencePack
from trainops.skills.evidence.pack import derivation_notes, derivation_problems, governance_errors
from trainops.tools.governance import approvals
from trainops.tools.governance.claims import AblationArm, resolve_run
from trainops.tools.governance.pack_checks import EVIDENCE_FILE, REPORT_FILE


def decide(pack: str, decision: approvals.Verdict, note: str = "", key: Path | None = None) -> approvals.Decision:
    """Sign and record a decision on a pack, with these validators run first on an approval."""
    return approvals.decide(pack, decision, note=note, key=key, evidence_problems=evidence_problems)


def approval_notes(pack: str) -> list[str]:
    """What an approval of this pack did not compare, and why, for the approver to read beside the
    decision (a pack an older trainops wrote carries no figures table to re-derive)."""
    try:
        evidence = EvidencePack.model_validate_json((approvals.pack_dir(pack) / EVIDENCE_FILE).read_bytes())
    except (ValidationError, ValueError, OSError):
        return []  # approval itself refuses an unreadable pack, naming why
    return derivation_notes(evidence)


def evidence_problems(folder: Path) -> list[str]:
    """The evidence validators (trainops.skills.evidence model + governance claims) on the files now."""
    try:
        pack = EvidencePack.model_validate_json((folder / EVIDENCE_FILE).read_bytes())
    except (ValidationError, ValueError) as exc:
        return [f"R-APR-1: {EVIDENCE_FILE} is not a valid evidence pack ({str(exc).splitlines()[0]}); build a new pack"]
    report = folder / REPORT_FILE
    markdown = report.read_text(encoding="utf-8", errors="replace") if report.is_file() else ""
    return governance_errors(pack, markdown) + _ablation_problems(pack) + derivation_problems(pack, folder)


def _ablation_problems(pack) -> list[str]:
    """R-ABL-1 on the configs the runs used: each arm against the baseline of its own rung of the
    ladder (`baseline_run`: same scale, processes and nodes), exactly one setting apart."""
    problems = []
    for row in pack.ablations:
        name = f"{row.knob}={row.value}"
        configs = [_run_config(run) for run in (row.baseline_run, row.source_run)]
        if None in configs:
            problems.append(f"R-ABL-1: ablation arm {name} at {row.scale} cannot be checked: the config.toml of its "
                            f"baseline run ({row.baseline_run}) or arm run ({row.source_run}) is missing; keep the "
                            "run folders with the pack")
            continue
        try:
            AblationArm(name=name, baseline_config=configs[0], arm_config=configs[1])
        except ValidationError as exc:
            problems += [f"ablation arm {name} at {row.scale}: {e['msg']}" for e in exc.errors()]
    return problems


def _run_config(run: str | None) -> dict | None:
    folder = resolve_run(run) if run else None
    config = RunFiles(folder).config if folder else None
    if config is None or not config.is_file():
        return None
    try:
        return tomllib.loads(config.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
