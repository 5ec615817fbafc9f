"""The demo's own pack, approved as a human would approve it: `trainops sop --quick` in a fresh
workspace (the `quick_sop` fixture), then `trainops approve PACK` with a key that the test's
allowed-signers file lists. Approval runs every evidence validator, R-ABL-1 among them: each
ablation arm against the baseline of its own rung of the ladder."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from trainops.commands.sop import _closing
from trainops.skills.sop_pack import Headline, SopResult

TRAINOPS = str(Path(sys.executable).parent / "trainops")


@pytest.mark.slow
def test_the_demo_pack_is_approved_with_a_listed_key(quick_sop, approvers):
    """The command the SOP prints, as printed, with the approver's key added."""
    pack_id = Path(quick_sop["pack_dir"]).name
    command = shlex.split(quick_sop["approve_command"])
    assert command[:3] == ["trainops", "approve", pack_id] == ["trainops", "approve", quick_sop["pack_id"]]
    env = {**os.environ, "TRAINOPS_HOME": quick_sop["home"], "OMP_NUM_THREADS": "1"}
    done = subprocess.run([TRAINOPS, *command[1:], "--key", str(approvers.alice.key), "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    decision = json.loads(done.stdout)
    assert (decision["decision"], decision["principal"]) == ("approved", "alice")


@pytest.mark.slow
def test_the_demo_ends_with_its_figures_the_report_and_how_to_approve(quick_sop):
    headline = quick_sop["headline"]
    assert headline["mfu_pct"] > 0 and headline["step_time_s"] > 0 and headline["recovery_time_s"] > 0
    assert headline["expected_waste_pct"] is not None and headline["recovery_fault"] == "crash"
    assert Path(quick_sop["report_html"]) == Path(quick_sop["pack_dir"]) / "report.html"
    assert Path(quick_sop["report_html"]).is_file()


def test_the_closing_lines_give_the_figures_the_report_path_and_the_exact_approve_command(capsys):
    result = SopResult(pack_dir="/ws/packs/sop-1", verdict="partial", blockers=["baseline has 2 repeat(s)"],
                       elapsed_s=125.0, pack_id="sop-1", report_html="/ws/packs/sop-1/report.html",
                       approve_command='trainops approve sop-1 --note "approved as reported"',
                       headline=Headline(mfu_pct=2.314, step_time_s=0.3127, step_time_spread_pct=12.04,
                                         recovery_time_s=8.43, recovery_fault="crash", expected_waste_pct=0.1384))
    _closing(result)
    out = " ".join(capsys.readouterr().out.split())
    for shown in ("MFU 2.31%", "step time 0.313 s, spread 12.0%", "recovery 8.4 s (crash drill)",
                  "expected waste 0.14%", "read: /ws/packs/sop-1/report.html",
                  'approve: trainops approve sop-1 --note "approved as reported"', "pack sop-1"):
        assert shown in out, out
