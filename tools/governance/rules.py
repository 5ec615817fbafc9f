"""Every AGENTS.md rule ID and the code that enforces it.

`RULES` is the registry: rule ID -> title, the enforcing callable (a dotted name that must
import), and where it is applied. tests/governance/test_rules_coverage.py reads the IDs from
AGENTS.md and proves that the two never drift apart.
"""
from __future__ import annotations

import importlib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

Where = Literal["claim model", "tool input", "action gate", "report text", "approval", "audit log", "escalation"]


class Rule(BaseModel):
    id: str = Field(description="The AGENTS.md rule ID, e.g. R-ENV-1.")
    title: str
    enforcement: str = Field(description="Dotted name of the validator, check or function that enforces it.")
    where: Where = Field(description="Where the enforcement is applied.")

    def resolve(self) -> Any:
        module, _, attr = self.enforcement.rpartition(":")
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj


_C = "trainops.tools.governance.claims"
RULES: dict[str, Rule] = {r.id: r for r in [
    Rule(id="R-ENV-1", title="MFU/scaling conclusions name model, hardware generation, layout, precision, "
                             "framework and version",
         enforcement=f"{_C}:MfuClaim._declared", where="claim model"),
    Rule(id="R-ENV-2", title="MFU figures cite the measured run they come from",
         enforcement=f"{_C}:MfuClaim._declared", where="claim model"),
    Rule(id="R-TOOL-1", title="Tools are called only through the gate with validated, typed input",
         enforcement="trainops.tools.calls:run_call", where="action gate"),
    Rule(id="R-ABL-1", title="An ablation arm changes exactly one setting against its baseline",
         enforcement=f"{_C}:AblationArm._single_variable", where="claim model"),
    Rule(id="R-ABL-2", title="A small-scale reproduction precedes the target scale",
         enforcement=f"{_C}:ScaleResult._small_first", where="claim model"),
    Rule(id="R-ABL-3", title="A gain that vanishes at target scale stops the rollout",
         enforcement=f"{_C}:ScaleResult._small_first", where="claim model"),
    Rule(id="R-EVD-1", title="Ranges state their basis; experiential ranges are labelled, not passed off as benchmarks "
                             "(each percentage range in report text is checked as a RangeStatement)",
         enforcement=f"{_C}:RangeStatement._labelled", where="claim model"),
    Rule(id="R-EVD-2", title="Fault-tolerance conclusions carry detection latency, isolation granularity, "
                             "recovery time and a drill record",
         enforcement=f"{_C}:FaultToleranceConclusion._complete", where="claim model"),
    Rule(id="R-EVD-3", title="Comparisons with public breakdowns name the source and the scale difference",
         enforcement=f"{_C}:ExternalComparison._sourced", where="claim model"),
    Rule(id="R-EVD-4", title="Cross-scale comparisons use weak-scaling efficiency, not absolute throughput",
         enforcement=f"{_C}:ScaleResult._small_first", where="claim model"),
    Rule(id="R-ESC-1", title="Falling effective training time escalates with the four-class interruption causes",
         enforcement="trainops.tools.governance.escalation:EscalationReport._all_fired_escalated", where="escalation"),
    Rule(id="R-ESC-2", title="An ablation failing at scale stops the rollout and is escalated",
         enforcement="trainops.tools.governance.escalation:EscalationReport._all_fired_escalated", where="escalation"),
    Rule(id="R-ESC-3", title="Suspected silent data corruption triggers fleet and co-located tests",
         enforcement="trainops.tools.governance.escalation:EscalationReport._all_fired_escalated", where="escalation"),
    Rule(id="R-ESC-4", title="Checkpoint save time near the MTBF moves to two-phase async checkpoints",
         enforcement="trainops.tools.governance.escalation:EscalationReport._all_fired_escalated", where="escalation"),
    Rule(id="R-SCH-1", title="Scheduler changes carry impact, pass a shadow replay trainops runs and record rollback",
         enforcement=f"{_C}:SchedulerChange._complete", where="tool input"),
    Rule(id="R-SEC-1", title="Tenant quota, priority and policy changes need a human approval",
         enforcement="trainops.tools.governance.gate:before_call", where="action gate"),
    Rule(id="R-SEC-2", title="Forbidden actions (global scheduler policy, forced cross-version upgrade) are refused",
         enforcement="trainops.tools.governance.gate:check_input", where="action gate"),
    Rule(id="R-SEC-3", title="Training data and checkpoints are isolated per tenant",
         enforcement="trainops.tools.changes.tenancy:check_tenant_path", where="action gate"),
    Rule(id="R-SEC-4", title="Irreversible and gated calls need a token signed by a human approver's SSH key, "
                             "single-use, expiring, bound to the queued call, revoked by a rejection",
         enforcement="trainops.tools.governance.tokens:consume", where="action gate"),
    Rule(id="R-SEC-5", title="Every tool call, gate decision and approval is in the hash-chained audit log, "
                             "anchored by the approvers' signatures",
         enforcement="trainops.tools.governance.verification:verify", where="audit log"),
    Rule(id="R-SEC-6", title="Gated calls need distinct human approvers by class (mutate 1, irreversible 2, "
                             "quota/priority/policy 2), never the requester",
         enforcement="trainops.tools.governance.tokens:consume", where="action gate"),
    Rule(id="R-CHG-1", title="Scheduler policy, quota and framework upgrade changes land only inside a configured "
                             "change window, or as an emergency signed by one more approver than their class",
         enforcement="trainops.tools.governance.windows:refusal", where="action gate"),
    Rule(id="R-APR-1", title="Evidence packs are approved or rejected by a human approver's SSH signature; "
                             "approved packs are immutable",
         enforcement="trainops.tools.governance.approvals:verify_pack", where="approval"),
    Rule(id="R-OUT-1", title="A report's first line is a verdict (pass/fail/partial) and its blockers",
         enforcement="trainops.tools.governance.text:validate_report_text", where="report text"),
    Rule(id="R-OUT-2", title="No placeholder text in any output (markers, letters in place of a figure, "
                             "unfilled template fields, unexpanded shell variables)",
         enforcement="trainops.tools.governance.text:check_text", where="report text"),
    Rule(id="R-OUT-3", title="Numbers: units glued to parameter counts (70B), ranges with ~, no space before %, "
                             "ASCII digits",
         enforcement="trainops.tools.governance.text:check_text", where="report text"),
]}

def agents_md_path() -> Path:
    """AGENTS.md as package data (the repository root's file, shipped inside the wheel)."""
    return Path(str(resources.files("trainops") / "AGENTS.md"))


def list_rules() -> list[Rule]:
    return list(RULES.values())
