"""The evidence pack carries an SDC case awaiting a human (issue 42 item 5, A-ESC-3): a case the SDC
response handed over on one of the pack's runs is in `awaiting_human` with the case's own pending
approval (not queued a second time), a pack that leaves a live case out is refused, and a case file
a job wrote over is not read as trainops' case. The full path (a watched job's divergence, the real
known-answer check, then the pack) is tests/tools/reliability/test_sdc_divergence.py's slow test."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.skills.escalate import hand_to_human
from trainops.skills.evidence.pack import PackRefused, assemble, write
from trainops.tools.governance import queue
from trainops.tools.governance.escalation import EscalationSignals, escalations_for, human_item
from trainops.tools.reliability.sdc_case import CASE_FILE, CheckRun, SdcCase, Suspect, write_case

pytestmark = pytest.mark.usefixtures("as_operator")


def handed_case(run: Path) -> SdcCase:
    """The case skills/sdc.respond writes, its check jobs stood in for: the escalation with the tests'
    results handed to a human (a real pending acknowledge_escalation) and the case bound to the audit log."""
    suspect = Suspect(rank=1, node="node-a", step=5, evidence="divergence: loss diverged without NaN on rank 1")
    signals = EscalationSignals(sdc_suspected=True,
                                sdc_evidence=f"rank 1 on node node-a at step 5 ({suspect.evidence})")
    fleet = CheckRun(kind="fleet", job_id="7", nodes=["node-a", "node-b"], state="completed")
    colocated = CheckRun(kind="colocated", job_id="8", nodes=["node-a", "node-b"], state="completed")
    results = [fleet.line(), colocated.line(), "quarantined checkpoint(s) []", "drained nothing"]
    esc = escalations_for(signals)[0]
    esc = esc.model_copy(update={"detail": esc.detail + "; " + "; ".join(results)})
    case = SdcCase(run_dir=str(run), suspect=suspect, quarantined=[], fleet=fleet, colocated=colocated, drained=[],
                   escalation=esc, pending_id=hand_to_human(esc, f"run {run}", results=results))
    write_case(case)
    return case


def test_evidence_build_carries_the_runs_sdc_case_with_its_own_pending_approval(factories, workspace):
    run = factories.write_run(workspace / "runs" / "run-1")
    case = handed_case(run)
    built = CliRunner().invoke(app, ["evidence", "build", str(run), "--json"])
    assert built.exit_code == 0, built.output
    pack_dir = Path(json.loads(built.stdout)["pack_dir"])
    awaiting = json.loads((pack_dir / "evidence.json").read_text())["awaiting_human"]
    assert human_item(case.escalation, case.pending_id) in awaiting
    assert [i for i in awaiting if i.startswith("R-ESC-3")] == [human_item(case.escalation, case.pending_id)]
    assert [p.id for p in queue.pending_calls()] == [case.pending_id]  # the case's hand-over, not a second one
    assert f"pending approval {case.pending_id}" in (pack_dir / "report.md").read_text()


def test_a_pack_leaving_out_a_live_drill_case_is_refused_and_a_case_a_job_wrote_over_is_not_read(factories,
                                                                                                  workspace):
    run = factories.write_run(workspace / "runs" / "drill-1")
    case = handed_case(run)
    drill = factories.drill().model_copy(update={"run_dir": str(run), "drill_record": str(run / "drill.json")})
    (run / "drill.json").write_text(drill.model_dump_json())
    pack = assemble("sdc-drill", factories.environment(), None, [], [drill], [])
    with pytest.raises(PackRefused, match="R-ESC-3: the pack's evidence fires it"):
        write(pack)

    forged = case.model_copy(update={"pending_id": "0" * 12})
    (run / CASE_FILE).write_text(forged.model_dump_json(indent=2) + "\n")  # the job can write its run folder
    built = CliRunner().invoke(app, ["evidence", "build", str(run), "--json"])
    assert built.exit_code == 0, built.output
    awaiting = json.loads((Path(json.loads(built.stdout)["pack_dir"]) / "evidence.json").read_text())["awaiting_human"]
    assert not [i for i in awaiting if i.startswith("R-ESC-3")]
    assert queue.get_pending(case.pending_id).tool == "acknowledge_escalation"  # the real one still waits
