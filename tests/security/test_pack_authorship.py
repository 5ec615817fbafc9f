"""Attack 11 (issue 23): the agent edits a pack trainops wrote (verdict pass with no drill run, an
MFU ten times what the runs measured), re-renders its reports with trainops' own renderer,
appends its own `pack_written` audit entry, and asks a human to approve. An audit line anyone
can append proves nothing; approval derives the pack again from its sources and refuses."""
from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.security.test_packs import _pack
from trainops.cli import app
from trainops.skills.evidence import pack as evidence_pack
from trainops.skills.evidence import plots
from trainops.skills.evidence.render import to_html, to_markdown
from trainops.tools.governance import approvals, pack_checks


def _forge(workspace, pack: str, **changes) -> None:
    """Edit evidence.json, redraw plots and reports from it as trainops would, forge the audit line."""
    folder = workspace / "packs" / pack
    edited = evidence_pack.load(folder).model_copy(update=changes)
    figures = plots.all_plots(edited)
    for figure in figures:
        (folder / "plots" / f"{figure.name}.png").write_bytes(figure.png)
    (folder / "evidence.json").write_text(edited.model_dump_json(indent=2) + "\n")
    (folder / "report.md").write_text(to_markdown(edited, figures))
    (folder / "report.html").write_text(to_html(edited, figures))
    pack_checks.record_written(folder, pack)


def _approve(pack: str, approvers) -> object:
    return CliRunner().invoke(app, ["approve", pack, "--key", str(approvers.alice.key), "--json"])


def test_a_verdict_edited_to_pass_with_no_drill_is_refused_despite_a_forged_written_record(workspace, approvers):
    pack = _pack(workspace)
    _forge(workspace, pack, verdict="pass", blockers=[])
    result = _approve(pack, approvers)
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "verdict 'pass'" in result.output and "no fault drill run" in result.output
    assert not approvals.decisions_dir(pack).exists()


def test_an_mfu_ten_times_what_the_runs_measured_is_refused(workspace, approvers):
    pack = _pack(workspace)
    baseline = evidence_pack.load(workspace / "packs" / pack).baseline
    inflated = baseline.model_copy(update={"mfu_pct": baseline.mfu_pct.model_copy(update={"median": 20.0})})
    _forge(workspace, pack, baseline=inflated)
    result = _approve(pack, approvers)
    assert result.exit_code != 0
    assert "baseline MFU 20% but its runs measure 2%" in result.output
    assert not approvals.decisions_dir(pack).exists()


def test_a_report_edited_alone_is_refused_even_with_a_matching_written_record(workspace, approvers):
    pack = _pack(workspace)
    report = workspace / "packs" / pack / "report.md"
    report.write_text(report.read_text().replace("Verdict: PARTIAL", "Verdict: PASS"))
    pack_checks.record_written(workspace / "packs" / pack, pack)
    result = _approve(pack, approvers)
    assert result.exit_code != 0 and "report.md is not the report trainops renders" in result.output


def test_a_pack_as_trainops_wrote_it_is_approved_and_its_decision_signs_the_files_checked(workspace, approvers):
    pack = _pack(workspace)
    result = _approve(pack, approvers)
    assert result.exit_code == 0, result.output
    decision = json.loads((approvals.decisions_dir(pack) / "0001.json").read_text())
    assert decision["files"] == pack_checks.content_entries(workspace / "packs" / pack)
