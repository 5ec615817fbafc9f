"""The audit log verified end to end (rule R-SEC-5): what `trainops audit verify` answers.

Four layers vouch for the log, each in its own module: the hash chain and its head file
(`audit.verify_chain`), the approvers' signed anchors (`anchors.problems`, each signed in this
workspace), and, for the workspace's own log, the approvers' receipts outside it
(`receipts.problems`: the newest signed decision cut is caught too) and every evidence-pack
decision (`approvals.unrecorded_decisions`). This module
sits above all three, so none of them imports another to be verified.
"""
from __future__ import annotations

from pathlib import Path

from trainops.tools.governance import anchors, audit, receipts
from trainops.tools.governance.approvals import unrecorded_decisions
from trainops.workspace import workspace_id


def verify(path: Path | None = None) -> audit.AuditReport:
    """The chain, then every signed anchor, then (for the workspace log) every pack decision and
    every receipt; the first failure is the report, naming the line where one is known."""
    report = audit.verify_chain(path)
    if not report.ok:
        return report
    entries = audit.read(path, first=report.entries)
    broken_anchor = anchors.problems(entries, workspace_id() if path is None else None)
    if broken_anchor:
        return report.model_copy(update={"ok": False, "first_bad_line": broken_anchor[0], "reason": broken_anchor[1]})
    if path is None:
        unrecorded = unrecorded_decisions(entries)
        if unrecorded:
            return report.model_copy(update={
                "ok": False, "reason": f"pack decision(s) {', '.join(unrecorded)} are not in the log: it was "
                                       "rewritten or replaced after they were made"})
        cut = receipts.problems(entries)
        if cut:
            return report.model_copy(update={"ok": False, "reason": cut})
        return report.model_copy(update={"reason": "chain intact; every signed anchor holds and every receipt "
                                                   "of a signed decision is in the log"})
    return report.model_copy(update={"reason": "chain intact; every signed anchor holds"})
