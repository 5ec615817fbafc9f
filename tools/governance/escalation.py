"""When the agent must stop and hand over to a human (R-ESC-1..4).

`required_escalations(signals)` says which triggers fire; an `EscalationReport` cannot be
built unless every fired trigger is escalated with the action its rule prescribes (a pack's
hand-over is read back into one by `report_problems`, from skills/evidence/pack.governance_errors). The SOP, the
pack and `watch_job` build the signals from what was measured (`checkpoint_save_s`, the
interruption record) and hand each fired rule to a human as a pending `acknowledge_escalation`.
"""
from __future__ import annotations

import re
import statistics
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from trainops.run_records import read_journal
from trainops.tools.base import tool
from trainops.tools.governance.claims import ScaleResult
from trainops.tools.planning.checkpoint_interval import CHECKPOINT_TOO_SLOW, checkpoint_overhead

CAUSE_CLASSES = ("hardware", "network", "software", "data")
ETTR_FALLING_READINGS = 3
ETTR_TOLERANCE_PCT = 3.0
"""ETTR readings closer than this (percentage points) are noise: a window's run-to-run spread on
a shared host. A decline is the window's last reading below its first by more than this, with
no reading back up to the first (a drop that recovered was not a decline)."""

Action = Literal["escalate_interruption_causes", "stop_rollout_and_roll_back", "fleet_and_colocated_sdc_tests",
                 "two_phase_async_checkpoint"]
ACTION_FOR = {
    "R-ESC-1": "escalate_interruption_causes",
    "R-ESC-2": "stop_rollout_and_roll_back",
    "R-ESC-3": "fleet_and_colocated_sdc_tests",
    "R-ESC-4": "two_phase_async_checkpoint",
}


class EscalationSignals(BaseModel):
    """What monitoring and the SOP steps observed."""
    ettr_history_pct: list[float] = Field(default_factory=list,
                                          description="Effective training time ratio per window, oldest first.")
    scale_results: list[ScaleResult] = Field(default_factory=list)
    vanished_arms: list[str] = Field(default_factory=list,
                                     description="Ablation arms (KNOB=VALUE) whose small-scale gain vanished at "
                                                 "target scale.")
    sdc_suspected: bool = Field(False,
                                description="Loss/grad-norm spikes, NaNs or checksum mismatches without a code change.")
    checkpoint_save_s: float | None = Field(None, ge=0, description="Measured blocking save time of one checkpoint.")
    mtbf_s: float | None = Field(None, gt=0, description="Mean time between failures of the job's footprint.")
    mtbf_source: str = Field("declared", description="Where the MTBF comes from: the interruption record or declared.")
    sdc_evidence: str = Field("", description="What made the corruption suspected (rank, node, step).")


def ettr_falling(history_pct: list[float]) -> bool:
    """The last ETTR_FALLING_READINGS windows fell and stayed down: 95, 60, 61 is a fall (the
    small uptick does not undo it); a flat series that wobbles within the tolerance is not."""
    recent = history_pct[-ETTR_FALLING_READINGS:]
    if len(recent) < ETTR_FALLING_READINGS:
        return False
    first, later = recent[0], recent[1:]
    return later[-1] < first - ETTR_TOLERANCE_PCT and max(later) < first


def required_escalations(signals: EscalationSignals) -> list[str]:
    fired = []
    if ettr_falling(signals.ettr_history_pct):
        fired.append("R-ESC-1")
    if signals.vanished_arms or any(
            r.target_gain_pct is not None and r.target_gain_pct <= r.min_gain_pct < (r.small_gain_pct or 0)
            for r in signals.scale_results):
        fired.append("R-ESC-2")
    if signals.sdc_suspected:
        fired.append("R-ESC-3")
    if signals.checkpoint_save_s is not None and signals.mtbf_s is not None and \
            checkpoint_overhead(signals.checkpoint_save_s, signals.mtbf_s) >= CHECKPOINT_TOO_SLOW:
        fired.append("R-ESC-4")
    return fired


class Escalation(BaseModel):
    rule_id: Literal["R-ESC-1", "R-ESC-2", "R-ESC-3", "R-ESC-4"]
    action: Action
    detail: str = Field(description="What the human needs to know to decide.")
    cause_distribution: dict[str, int] | None = Field(
        None, description="Interruptions per class (hardware/network/software/data, and planned/unclassified where "
                          "the record has them); required for R-ESC-1.")


class EscalationReport(BaseModel):
    """The hand-over: every fired trigger escalated with its prescribed action."""
    signals: EscalationSignals
    escalations: list[Escalation] = Field(default_factory=list)

    @model_validator(mode="after")
    def _all_fired_escalated(self) -> "EscalationReport":
        raised = {e.rule_id: e for e in self.escalations}
        for rule_id in required_escalations(self.signals):
            esc = raised.get(rule_id)
            if esc is None or esc.action != ACTION_FOR[rule_id]:
                raise ValueError(f"{rule_id}: escalations={sorted(raised)} miss a fired trigger; fix: add "
                                 f"Escalation(rule_id='{rule_id}', action='{ACTION_FOR[rule_id]}', detail=...)")
            if rule_id == "R-ESC-1" and not set(CAUSE_CLASSES) <= set(esc.cause_distribution or {}):
                raise ValueError(f"R-ESC-1: cause_distribution={esc.cause_distribution!r} must count interruptions "
                                 f"for each of {', '.join(CAUSE_CLASSES)}; fix: classify every interruption")
        return self


def describe(rule_id: str, signals: EscalationSignals) -> str:
    """What the human needs to know about one fired rule, from its signals."""
    if rule_id == "R-ESC-1":
        return (f"effective training time fell over the last {ETTR_FALLING_READINGS} windows: "
                + " -> ".join(f"{v:.1f}%" for v in signals.ettr_history_pct[-ETTR_FALLING_READINGS:]))
    if rule_id == "R-ESC-2":
        arms = signals.vanished_arms or [r.knob for r in signals.scale_results]
        return f"the small-scale gain of {', '.join(arms)} vanished at target scale: stop the rollout, roll back"
    if rule_id == "R-ESC-3":
        return f"suspected silent data corruption: {signals.sdc_evidence or 'replica checksums or NaNs'}"
    overhead = checkpoint_overhead(signals.checkpoint_save_s or 0.0, signals.mtbf_s or 1.0)
    return (f"checkpoint save blocks {signals.checkpoint_save_s:.2f} s at an MTBF of {signals.mtbf_s / 3600:.2f} h "
            f"({signals.mtbf_source}): {overhead:.1%} of wall time, at or above {CHECKPOINT_TOO_SLOW:.0%}")


def escalations_for(signals: EscalationSignals, causes: dict[str, int] | None = None) -> list[Escalation]:
    """Every fired rule as the escalation its rule prescribes; R-ESC-1 carries the cause split."""
    counts = {c: 0 for c in CAUSE_CLASSES} | dict(causes or {})
    return [Escalation(rule_id=rule_id, action=ACTION_FOR[rule_id], detail=describe(rule_id, signals),
                       cause_distribution=counts if rule_id == "R-ESC-1" else None)
            for rule_id in required_escalations(signals)]


def human_item(esc: Escalation, pending_id: str | None = None) -> str:
    """The escalation as a line of the pack's `awaiting_human` (how a pack carries a rule)."""
    causes = (" causes " + ", ".join(f"{k} {v}" for k, v in esc.cause_distribution.items())
              if esc.cause_distribution else "")
    pending = f" [pending approval {pending_id}]" if pending_id else ""
    return f"{esc.rule_id} {esc.action}: {esc.detail}.{causes}{pending}"


def carried_rules(awaiting_human: list[str]) -> set[str]:
    return {item.split(" ", 1)[0] for item in awaiting_human if item.startswith("R-ESC-")}


HUMAN_ITEM = re.compile(r"^(R-ESC-\d+) (\w+): (.*?)\.(?: causes (.*?))?(?: \[pending approval [^\]]*\])?$")
"""A `human_item` line read back: rule, action, detail, the cause split."""


def report_problems(signals: EscalationSignals, awaiting_human: list[str]) -> list[str]:
    """R-ESC-1..4 on a pack's hand-over: its awaiting_human lines, read back as escalations, must
    make a valid `EscalationReport` for its signals: each fired rule with the action its rule
    prescribes, R-ESC-1 with the four-class cause split."""
    problems, escalations = [], []
    for line in (item for item in awaiting_human if item.startswith("R-ESC-")):
        m = HUMAN_ITEM.match(line)
        pairs = [pair.rsplit(" ", 1) for pair in m.group(4).split(", ")] if m and m.group(4) else []
        try:
            escalations.append(Escalation(rule_id=m.group(1), action=m.group(2), detail=m.group(3),
                                          cause_distribution={k: int(v) for k, v in pairs} if pairs else None))
        except (AttributeError, ValueError) as exc:  # no match, or a field its rule does not allow
            why = "; ".join(e["msg"] for e in exc.errors()) if isinstance(exc, ValidationError) else "unreadable"
            problems.append(f"{line.split(' ', 1)[0]}: awaiting_human item {line[:120]!r} is not an escalation "
                            f"trainops wrote ({why}); fix: build the pack through the SOP")
    try:
        EscalationReport(signals=signals, escalations=escalations)
    except ValidationError as exc:
        problems += [str(e["ctx"]["error"]) if "ctx" in e else e["msg"] for e in exc.errors()]
    return problems


def checkpoint_save_s(run_dirs: list[str]) -> float | None:
    """The median time training blocked on a save, from the runs' checkpoint journals; None
    when no run committed one."""
    stalls = [save.stall_s for run in run_dirs for save in read_journal(run).saves]
    return statistics.median(stalls) if stalls else None


class AcknowledgeEscalationInput(BaseModel):
    rule_id: Literal["R-ESC-1", "R-ESC-2", "R-ESC-3", "R-ESC-4"]
    action: Action
    subject: str = Field(description="What fired it: job JOB, run RUN or pack PACK.")
    detail: str = Field(description="What the human needs to know to decide.")
    cause_distribution: dict[str, int] | None = None
    results: list[str] = Field(default_factory=list, description="Test results the case rests on (R-ESC-3).")


class AcknowledgeEscalationOutput(BaseModel):
    rule_id: str
    subject: str
    acknowledged: bool


@tool("acknowledge_escalation", risk="mutate", approval_required=True, tags=("governance", "escalation"))
def acknowledge_escalation(inp: AcknowledgeEscalationInput) -> AcknowledgeEscalationOutput:
    """A human takes over a fired escalation rule (R-ESC-1..4): the call waits in the approval
    queue until a human signs it; the signed call in the audit log is the hand-over."""
    return AcknowledgeEscalationOutput(rule_id=inp.rule_id, subject=inp.subject, acknowledged=True)

