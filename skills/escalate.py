"""Fired escalation rules handed to a human: each becomes a pending `acknowledge_escalation`
(the approval queue, R-SEC-4) and a line the pack carries in `awaiting_human`."""
from __future__ import annotations

from trainops.tools.calls import invoke, validating
from trainops.tools.context import CallContext
from trainops.tools.governance import queue
from trainops.tools.governance.escalation import (
    AcknowledgeEscalationInput,
    Escalation,
    EscalationSignals,
    acknowledge_escalation,
    carried_rules,
    describe,
    escalations_for,
    human_item,
    required_escalations,
)
from trainops.tools.governance.gate import GateRefused
from trainops.tools.reliability.sdc_case import SdcCase, read_case
from trainops.tools.reliability.watch import record_view

ETTR_WINDOW_S = 3600.0
"""The default effective-training-time window (an hour); the SOP's `ettr_window_s` sets it for a
pack, whose S2 reliability block states it."""


def hand_to_human(esc: Escalation, subject: str, ctx: CallContext | None = None,
                  results: list[str] | None = None) -> str | None:
    """Queue the escalation as a pending approval; returns its id (None: the call ran under a
    token, so a human already took it)."""
    with validating(acknowledge_escalation):
        inp = AcknowledgeEscalationInput.model_validate({**esc.model_dump(), "subject": subject,
                                                         "results": results or []})
    try:
        invoke(acknowledge_escalation, inp, ctx)
    except GateRefused as refused:
        if refused.pending_id is None:
            raise
        return refused.pending_id
    return None


def human_items(escalations: list[Escalation], subject: str, ctx: CallContext | None = None) -> list[str]:
    """Each escalation queued for a human, as the pack's line for it (naming its pending approval)."""
    return [human_item(esc, hand_to_human(esc, subject, ctx)) for esc in escalations]


def pack_signals(pack) -> EscalationSignals:
    """R-ESC signals from what a pack measured: arms whose gain vanished at scale (R-ESC-2) and
    the checkpoint stall against the plan's MTBF (R-ESC-4, stall measured from the drill run's
    journal); R-ESC-1 from the interruption record as of the pack's creation; R-ESC-3 from an SDC
    case on one of its runs still awaiting a human."""
    plan = pack.checkpoint_plan
    ettr, _causes = record_ettr(until=pack.created_time, window_s=pack_window_s(pack))
    cases = awaiting_cases(pack)
    return EscalationSignals(ettr_history_pct=ettr, sdc_suspected=bool(cases),
                             sdc_evidence="; ".join(f"rank {c.suspect.rank} on node {c.suspect.node} at step "
                                                    f"{c.suspect.step} ({c.suspect.evidence})" for c in cases),
                             vanished_arms=[f"{r.knob}={r.value}" for r in pack.ablations if r.vanished_at_scale],
                             checkpoint_save_s=plan.save_stall_s if plan else None,
                             mtbf_s=plan.mtbf_h * 3600 if plan else None,
                             mtbf_source=plan.mtbf_basis if plan else "no checkpoint plan")


def awaiting_cases(pack) -> list[SdcCase]:
    """The SDC cases of the pack's runs (baseline repeats, arms, drills) whose hand-over no human has
    decided yet: each read from its run's RUN/sdc-case.json only where the bytes are the ones the
    response wrote (a job can write its run folder, so a case it made or edited is not carried)."""
    drills = pack.fault_tolerance.drills if pack.fault_tolerance else []
    runs = [*(pack.baseline.run_dirs if pack.baseline else []), *(r.source_run for r in pack.ablations),
            *(d.run_dir for d in drills)]
    cases = [case for run in dict.fromkeys(runs) if (case := read_case(run)) is not None]
    pending = {call.id for call in queue.pending_calls() if call.status == "pending"} if cases else set()
    return [case for case in cases if case.pending_id in pending]


def escalation_problems(pack) -> list[str]:
    """A pack whose evidence fires a rule it does not carry (in awaiting_human) is refused."""
    signals = pack_signals(pack)
    carried = carried_rules(pack.awaiting_human)
    return [f"{rule}: the pack's evidence fires it ({describe(rule, signals)}) but awaiting_human does not carry it; "
            "fix: build the pack through the SOP, which hands each fired rule to a human"
            for rule in required_escalations(signals) if rule not in carried]


def pack_window_s(pack) -> float:
    """The ETTR window the pack's S2 reliability block states (the SOP's setting), else the default."""
    rel = pack.baseline.reliability if pack.baseline else None
    return rel.ettr_window_s if rel else ETTR_WINDOW_S


def record_ettr(until: float | None = None, window_s: float = ETTR_WINDOW_S) -> tuple[list[float], dict[str, int]]:
    """ETTR per closed window and the cause split from the interruption record (up to `until`):
    the view `watch_job` reads too."""
    view = record_view(window_s, 24.0, until=until)
    return view.ettr_pct, view.cause_distribution


def carry_fired(pack, ctx: CallContext | None = None):
    """The pack with every rule its evidence fires handed to a human and carried in awaiting_human
    (with the record's cause split for R-ESC-1; an SDC case as its response handed it, with the
    case's own pending approval): what the SOP does before writing a pack."""
    _ettr, causes = record_ettr(until=pack.created_time, window_s=pack_window_s(pack))
    fired = escalations_for(pack_signals(pack), causes)
    handed = [row.stop.human_item for row in pack.ablations if row.stop and row.stop.human_item]
    if handed and all(row.stop and row.stop.human_item for row in pack.ablations if row.vanished_at_scale):
        fired = [esc for esc in fired if esc.rule_id != "R-ESC-2"]  # each stop's ladder handed it over already
    if cases := awaiting_cases(pack):  # the SDC response handed each case over with its test results
        handed += [human_item(case.escalation, case.pending_id) for case in cases]
        fired = [esc for esc in fired if esc.rule_id != "R-ESC-3"]
    items = [item for item in handed if item not in pack.awaiting_human]
    items += human_items(fired, f"pack {pack.pack_id}", ctx)
    return pack.model_copy(update={"awaiting_human": [*pack.awaiting_human, *items]}) if items else pack
