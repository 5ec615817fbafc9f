"""The audit log verified end to end (rule R-SEC-5): what `trainops audit verify` answers.

Three layers vouch for the log, each in its own module: the hash chain and its head file
(`audit.verify_chain`), the approvers' signed anchors (`anchors.problems`), and, for the
workspace's own log, every evidence-pack decision (`approvals.unrecorded_decisions`). This module
sits above all three, so none of them imports another to be verified.
"""
from __future__ import annotations

from pathlib import Path

from trainops.tools.governance import anchors, audit
from trainops.tools.governance.approvals import unrecorded_decisions


def verify(path: Path | None = None) -> audit.AuditReport:
    """The chain, then every signed anchor, then (for the workspace log) every pack decision; the
    first failure is the report, naming the line where one is known."""
    report = audit.verify_chain(path)
    if not report.ok:
        return report
    entries = audit.read(path, first=report.entries)
    broken_anchor = anchors.problems(entries)
    if broken_anchor:
        return report.model_copy(update={"ok": False, "first_bad_line": broken_anchor[0], "reason": broken_anchor[1]})
    if path is None:
        unrecorded = unrecorded_decisions(entries)
        if unrecorded:
            return report.model_copy(update={
                "ok": False, "reason": f"pack decision(s) {', '.join(unrecorded)} are not in the log: it was "
                                       "rewritten or replaced after they were made"})
    return report.model_copy(update={"reason": "chain intact; every signed anchor holds"})
