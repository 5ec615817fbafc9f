"""The audit log's hash chain: tampering is detected at the right line; concurrent writers keep it valid."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.governance import audit, verification

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def log(workspace):
    for i in range(5):
        audit.append("tool_call", tool=f"t{i}", ok=True)
    return workspace / "audit.jsonl"


def _lines(log: Path) -> list[str]:
    return log.read_text().splitlines(keepends=True)


def _write(log: Path, lines: list[str]) -> None:
    log.write_text("".join(lines))


@pytest.mark.rule("R-SEC-5", case="compliant")
def test_untouched_log_verifies_and_links_each_entry_to_the_previous(log):
    report = verification.verify()
    assert (report.ok, report.entries, report.first_bad_line) == (True, 5, None)
    entries = audit.read()
    assert entries[0]["prev_hash"] == audit.GENESIS_HASH
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(entries, entries[1:], strict=False))


@pytest.mark.rule("R-SEC-5", case="violation")
def test_edited_entry_is_detected_at_its_line(log):
    lines = _lines(log)
    entry = json.loads(lines[2])
    entry["ok"] = False
    lines[2] = audit.canonical_json(entry) + "\n"
    _write(log, lines)
    report = verification.verify()
    assert (report.ok, report.first_bad_line) == (False, 3) and "edited" in report.reason


def test_deleted_entry_is_detected_at_the_line_after_the_gap(log):
    lines = _lines(log)
    del lines[1]
    _write(log, lines)
    assert verification.verify().first_bad_line == 2


def test_inserted_well_formed_entry_is_detected_where_the_chain_breaks(log):
    lines = _lines(log)
    fake = {"seq": 3, "time": 0, "kind": "tool_call", "tool": "sneaky", "prev_hash": json.loads(lines[1])["hash"]}
    fake["hash"] = audit.entry_hash(fake)
    lines.insert(2, audit.canonical_json(fake) + "\n")
    _write(log, lines)
    report = verification.verify()
    assert (report.ok, report.first_bad_line) == (False, 4)


def test_reordered_entries_are_detected_at_the_first_moved_line(log):
    lines = _lines(log)
    lines[1], lines[2] = lines[2], lines[1]
    _write(log, lines)
    assert verification.verify().first_bad_line == 2


def test_entries_cut_from_the_end_are_detected(log):
    _write(log, _lines(log)[:3])
    report = verification.verify()
    assert (report.ok, report.first_bad_line) == (False, 4) and "removed from or replaced at the end" in report.reason


def test_audit_verify_cli_exits_1_and_names_the_line(log):
    lines = _lines(log)
    del lines[3]
    _write(log, lines)
    result = CliRunner().invoke(app, ["audit", "verify", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.output)["first_bad_line"] == 4


_WRITER = """
import sys
from trainops.tools.governance import audit
for i in range(int(sys.argv[2])):
    audit.append("tool_call", tool="writer", writer=int(sys.argv[1]), i=i)
"""


@pytest.mark.slow
def test_four_concurrent_writers_leave_a_valid_chain(workspace):
    env = {**os.environ, "TRAINOPS_HOME": str(workspace), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(w), "50"], env=env, cwd=ROOT) for w in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    report = verification.verify()
    assert (report.ok, report.entries) == (True, 200), report.reason
    assert sorted((e["writer"], e["i"]) for e in audit.read()) == [(w, i) for w in range(4) for i in range(50)]
