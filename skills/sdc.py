"""What a suspected silent data corruption sets off (R-ESC-3): quarantine the checkpoints from the
suspect step on, name the suspect rank and node, run the known-answer check (trainops.tools.reliability.sdc_check)
through the scheduler on every node of the partition (fleet-wide) and on the suspect beside a
known-good node (co-located), drain the node that fails (gated drain_node, only where a node that
passed remains to run on), and hand the case with both results to a human (a pending approval).
Every step is a tool call, so it passes the gate as `skill:sdc-response`."""
from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, Field

from trainops.run_folder import new_run_folder
from trainops.run_records import read_heartbeat
from trainops.skills.escalate import hand_to_human
from trainops.tools.calls import invoke
from trainops.tools.context import CallContext, skill_context
from trainops.tools.governance.escalation import EscalationSignals, escalations_for, human_item
from trainops.tools.jobs import jobs
from trainops.tools.reliability import quarantine
from trainops.tools.reliability.sdc_case import CASE_FILE as CASE_FILE  # the case's record, re-exported
from trainops.tools.reliability.sdc_case import CASE_KIND as CASE_KIND
from trainops.tools.reliability.sdc_case import CheckRun, SdcCase, Suspect, write_case
from trainops.tools.reliability.sdc_case import case_key as case_key
from trainops.tools.reliability.sdc_case import case_problem as case_problem
from trainops.tools.reliability.sdc_check import NodeResult, results_in
from trainops.tools.reliability.signals import DetectFaultsInput, FaultWatch
from trainops.tools.schedulers.base import JobSpec

USABLE = ("idle", "allocated", "mixed", "completing")
CHECK_LOG_LINES = 2000
"""The check job's log lines read for its answers: one line per node, beside the launcher's own."""


def suspect_in(run_dir: str | Path) -> Suspect | None:
    """The suspect a run's own replica checksums name (the first step where a replica group's
    `param_checksum` values disagree), read with detect_faults's watch; None when they all agree."""
    watch = FaultWatch(DetectFaultsInput(run=str(run_dir)), Path(run_dir))
    watch.ingest()
    if (odd := watch.checksum_mismatch()) is None:
        return None
    rec, why = odd
    return Suspect(rank=rec.rank, node=rec.host, step=rec.step, evidence=f"checksum_mismatch: {why}")


def fleet_nodes(nodes: list, suspect_node: str | None) -> list[str]:
    """The usable nodes of the suspect's partition(s): a node in none of them (a shadow partition's,
    say) cannot run the partition's check jobs. Where the scheduler names no partitions, every node."""
    home = next((set(n.partitions) for n in nodes if n.name == suspect_node and n.partitions), None)
    return [n.name for n in nodes if n.state in USABLE and (home is None or home & set(n.partitions))]


def respond(run_dir: str, suspect: Suspect, scheduler: str = "local", ctx: CallContext | None = None,
            timeout_s: float = 300.0) -> SdcCase:
    """The whole response; the suspect's job must already be stopped (its nodes are tested)."""
    ctx = skill_context("sdc-response", ctx)
    beat = read_heartbeat(run_dir, suspect.rank)  # the rank's own host: metrics lines do not carry one
    suspect = suspect.model_copy(update={"node": beat.host if beat and beat.host else suspect.node})
    quarantined = invoke(quarantine.quarantine_checkpoints,
                         quarantine.QuarantineInput(run=run_dir, from_step=suspect.step), ctx).quarantined_steps
    nodes = fleet_nodes(invoke(jobs.list_nodes, jobs.SchedulerRef(scheduler=scheduler), ctx).nodes, suspect.node)
    fleet = run_check("fleet", nodes, nodes, scheduler, ctx, timeout_s)
    good = [n for n in nodes if n not in fleet.failed_nodes and n != suspect.node]
    if suspect.node in nodes and good:
        colocated = run_check("colocated", [suspect.node, good[0]], nodes, scheduler, ctx, timeout_s)
    else:
        colocated = CheckRun(kind="colocated", nodes=[], note=f"needs the suspect node ({suspect.node}) and a "
                                                             f"known-good one; the partition has {nodes}")
    failing = sorted(set(fleet.failed_nodes) | set(colocated.failed_nodes))
    drained = drain_failing(failing, [n for n in nodes if n not in failing], scheduler, ctx)
    signals = EscalationSignals(sdc_suspected=True, sdc_evidence=f"rank {suspect.rank} on node {suspect.node} at "
                                                                 f"step {suspect.step} ({suspect.evidence})")
    escalation = escalations_for(signals)[0]
    results = [fleet.line(), colocated.line(), f"quarantined checkpoint(s) {quarantined}",
               f"drained {', '.join(drained) or 'nothing'}"
               + ("" if drained or not failing else " (no node that passed is left to run on: a human decides)")]
    escalation = escalation.model_copy(update={"detail": escalation.detail + "; " + "; ".join(results)})
    pending = hand_to_human(escalation, f"run {run_dir}", ctx, results=results)
    case = SdcCase(run_dir=run_dir, suspect=suspect, quarantined=quarantined, fleet=fleet, colocated=colocated,
                   drained=drained, escalation=escalation, pending_id=pending)
    write_case(case)
    return case


def run_check(kind: str, nodes: list[str], partition: list[str], scheduler: str, ctx: CallContext,
              timeout_s: float) -> CheckRun:
    """Submit the known-answer check on exactly `nodes` (the rest of the partition excluded), wait
    for it, and read each node's answer from the check job's own log as the scheduler collected it
    (never a file in a folder another job can write); a node that gave none failed."""
    folder = new_run_folder(prefix=f"sdc-{kind}")
    spec = JobSpec(name=f"sdc-{kind}", command=["-m", "trainops.tools.reliability.sdc_check"],
                   launcher="torchrun", nodes=len(nodes), procs_per_node=1, run_dir=str(folder),
                   exclude_nodes=[n for n in partition if n not in nodes], env={"OMP_NUM_THREADS": "1"})
    job_id = invoke(jobs.submit_job, jobs.SubmitJobInput(scheduler=scheduler, spec=spec), ctx).handle.job_id
    status = invoke(jobs.wait_job, jobs.WaitJobInput(job_id=job_id, scheduler=scheduler, timeout_s=timeout_s), ctx)
    log = invoke(jobs.job_logs, jobs.JobLogsInput(job_id=job_id, scheduler=scheduler, tail=CHECK_LOG_LINES), ctx)
    results, failed, note = verdict(results_in(log.text), nodes, status.nodes)
    return CheckRun(kind=kind, job_id=job_id, nodes=nodes, state=status.state, results=results, failed_nodes=failed,
                    note=note)


def verdict(results: list[NodeResult], nodes: list[str], allocated: list[str]) -> tuple[list[NodeResult], list[str],
                                                                                         str]:
    """(the answers taken, the nodes that failed, a note) from a check job's result lines: only a node the
    scheduler allocated the check (among those it was to run on) answers, one answer per rank; a node
    with a wrong answer or none failed. More answers for a rank than one is not the check's own output
    alone: nothing is convicted, and the note says to run the check again."""
    taken = [r for r in results if r.host in allocated and r.host in nodes]
    ranks = [r.rank for r in taken]
    if len(set(ranks)) != len(ranks) or len(taken) > len(nodes):
        return taken, [], (f"the check job's log holds {len(taken)} answers from {len(set(ranks))} rank(s) for "
                           f"{len(nodes)} node(s): not one answer per rank; no node convicted, run the check again")
    outside = sorted({r.host for r in results} - {r.host for r in taken})
    note = f"answers naming {', '.join(outside)} (not a node the check ran on) left out" if outside else ""
    answered = {r.host for r in taken}
    return taken, sorted({r.host for r in taken if not r.ok} | {n for n in nodes if n not in answered}), note


class FleetRound(BaseModel):
    """One round of the periodic fleet check (`trainops sdc-check`): its check job and, where a node
    failed, what was drained and the hand-over's awaiting_human line."""
    started_at: float
    check: CheckRun
    drained: list[str] = Field(default_factory=list)
    handed_to_human: str = ""


def fleet_round(scheduler: str, ctx: CallContext | None = None, timeout_s: float = 300.0) -> FleetRound:
    """The known-answer check on every usable node, with no suspect needed (K-FM-5: a defective chip
    found before a job trips on it); a node that fails is drained where one that passed remains, and
    the result goes to a human as R-ESC-3, as a suspect's case does."""
    ctx, started = skill_context("sdc-response", ctx), time.time()
    nodes = fleet_nodes(invoke(jobs.list_nodes, jobs.SchedulerRef(scheduler=scheduler), ctx).nodes, None)
    check = run_check("fleet", nodes, nodes, scheduler, ctx, timeout_s)
    if not check.failed_nodes:
        return FleetRound(started_at=started, check=check)
    drained = drain_failing(check.failed_nodes, [n for n in nodes if n not in check.failed_nodes], scheduler, ctx)
    signals = EscalationSignals(sdc_suspected=True, sdc_evidence="the periodic fleet known-answer check failed on "
                                                                 + ", ".join(check.failed_nodes))
    results = [check.line(), f"drained {', '.join(drained) or 'nothing'}"]
    esc = escalations_for(signals)[0]
    esc = esc.model_copy(update={"detail": esc.detail + "; " + "; ".join(results)})
    pending = hand_to_human(esc, f"fleet check job {check.job_id}", ctx, results=results)
    return FleetRound(started_at=started, check=check, drained=drained, handed_to_human=human_item(esc, pending))


def drain_failing(failing: list[str], passed: list[str], scheduler: str, ctx: CallContext) -> list[str]:
    """Drain each failing node through the gated tool while a node that passed remains to run on."""
    if not passed:
        return []
    for node in failing:
        invoke(jobs.drain_node, jobs.DrainNodeInput(node=node, scheduler=scheduler,
                                                    reason="trainops: failed the known-answer SDC check"), ctx)
    return failing


def act_on_watch(watched, scheduler: str, ctx: CallContext | None = None) -> list[str]:
    """What `trainops watch` does with a watch_job result whose rules fired: a suspected SDC stops
    the job and runs the SDC response (which hands the case over with its test results); every
    other rule goes to a human as it is. Returns the pack-style line of each."""
    lines = []
    for esc in watched.fired:
        if esc.rule_id == "R-ESC-3" and watched.suspect is not None and watched.run_dir:
            if not watched.ended:  # its nodes are what the tests check
                invoke(jobs.cancel_job, jobs.CancelJobInput(job_id=watched.job_id, scheduler=scheduler, force=True),
                       ctx)
            suspect = Suspect.model_validate(watched.suspect.model_dump())
            case = respond(watched.run_dir, suspect, scheduler, ctx)
            lines.append(human_item(case.escalation, case.pending_id))
        else:
            lines.append(human_item(esc, hand_to_human(esc, f"job {watched.job_id}", ctx)))
    return lines

