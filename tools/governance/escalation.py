"""When the agent must stop and hand over to a human (R-ESC-1..4).

`required_escalations(signals)` says which triggers fire; an `EscalationReport` cannot be
built unless every fired trigger is escalated with the action its rule prescribes.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from trainops.tools.governance.claims import ScaleResult
from trainops.tools.planning import CHECKPOINT_TOO_SLOW, checkpoint_overhead

CAUSE_CLASSES = ("hardware", "network", "software", "data")
ETTR_FALLING_READINGS = 3

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
    sdc_suspected: bool = Field(False,
                                description="Loss/grad-norm spikes, NaNs or checksum mismatches without a code change.")
    checkpoint_save_s: float | None = Field(None, ge=0, description="Measured blocking save time of one checkpoint.")
    mtbf_s: float | None = Field(None, gt=0, description="Mean time between failures of the job's footprint.")


def required_escalations(signals: EscalationSignals) -> list[str]:
    fired = []
    recent = signals.ettr_history_pct[-ETTR_FALLING_READINGS:]
    if len(recent) == ETTR_FALLING_READINGS and all(b < a for a, b in zip(recent, recent[1:], strict=False)):
        fired.append("R-ESC-1")
    if any(r.target_gain_pct is not None and r.target_gain_pct <= r.min_gain_pct < (r.small_gain_pct or 0)
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
        None, description="Interruptions per class (hardware/network/software/data); required for R-ESC-1.")


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
            if rule_id == "R-ESC-1" and set(esc.cause_distribution or {}) != set(CAUSE_CLASSES):
                raise ValueError(f"R-ESC-1: cause_distribution={esc.cause_distribution!r} must count interruptions "
                                 f"for exactly {', '.join(CAUSE_CLASSES)}; fix: classify every interruption")
        return self
