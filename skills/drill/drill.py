"""S5: fault drills. Launch a checkpointing job, inject a fault, detect it, isolate it, restart
from the newest good checkpoint, and time every phase; the restored checkpoint is verified.
Every step that changes the world (launch, injection, cancel, drain, quarantine, requeue) is a
tool call, so it passes the gate as `skill:fault-drill` for whoever ran the drill."""
from __future__ import annotations

import json
import time
from pathlib import Path

from pydantic import BaseModel, Field

from trainops.run_folder import RunFiles
from trainops.run_records import read_journal, read_metrics, supervised_since
from trainops.settings import read_toml
from trainops.skills import sdc
from trainops.skills.baseline import Progress, command_line, submit
from trainops.skills.drill.nodes import NodeTarget, RankTarget
from trainops.skills.drill.recovery import (
    MeasuredRecovery,
    RecoveryMarks,
    in_process_recovery,
    phases_line,
    requeue_recovery,
)
from trainops.skills.drill.restart import Restart, isolate_node, verify_restored
from trainops.skills.drill.waits import between_writes, fault_fired, heartbeat_step, wait_for, wait_for_restart
from trainops.skills.evidence.model import DrillResult, EvidenceRow
from trainops.skills.request import JobRequest
from trainops.tools.base import ToolError
from trainops.tools.calls import invoke
from trainops.tools.context import CallContext, skill_context
from trainops.tools.jobs import jobs
from trainops.tools.jobs.follow import JobWatch
from trainops.tools.jobs.trainer_job import check_layout
from trainops.tools.reliability import detection as detection_tool
from trainops.tools.reliability import faults, interruptions
from trainops.tools.reliability.signals import DetectFaultsInput, Detection

# drill kind -> inject_fault kind; runtime kinds are injected into the live job, launch-time kinds
# (LAUNCH_TIME) start the job with the overrides inject_fault returns. A drill's cause is not here:
# it is what the interruption record's evidence says for the drill's job end (tools/interruptions).
DRILLS: dict[str, str] = {
    "crash": "kill_rank",
    "node-loss": "kill_node",
    "hang": "hang",
    "checkpoint-corruption": "corrupt_checkpoint",
    "nan": "nan",
    "bitflip": "bitflip",
    "straggler": "straggler",
    "node-crash": "node_crash",
    "power-loss": "power_loss",
    "partition": "partition",
    "slow-network": "slow_network",
}
NODE_DRILLS = {"node-crash", "power-loss", "partition", "slow-network"}
"""Real node and network faults: a multi-node job on a `trainops sandbox` cluster loses (or is slowed
by) its last node, which is drained and replaced by a hot spare, then repaired, checked and resumed."""
# launch-time drill -> (the trainer's faults.jsonl kind when it fires, extra launch overrides)
LAUNCH_TIME: dict[str, tuple[str, list[str]]] = {
    "nan": ("nan", []),
    "bitflip": ("bitflip", ["parallel.data_parallel=ddp"]),  # replicas, so their checksums can disagree
    "straggler": ("slow", []),
}
DETECTION_ONLY = {
    "straggler": ("needs a spare node", "a slow node stays slow, so restarting on the same (only) node brings the "
                  "straggler back; drain it and requeue on a hot spare"),
}
"""Drills measured up to detection and isolation only: (what recovery needs, why)."""


class DetectionOnlyResult(BaseModel):
    """A drill stopped after detection: restarting would not recover anything on this machine."""
    fault: str
    run_dir: str
    injected_at_step: int = Field(ge=0)
    detection_latency_s: float = Field(ge=0)
    isolation_granularity: str = Field(description="what the detector recommends taking out")
    detector: str
    recovery: str = Field(description="what recovery needs that this machine lacks")
    note: str = Field(description="why restarting here would not be a recovery")
    drill_record: str = Field(description="RUN/detection.json")
    false_positives: list[dict] = Field(default_factory=list,
                                        description="findings by another signal before the fault's own (detect_faults)")


class DrillRefused(ValueError):
    """A drill that cannot teach anything: unknown fault or nothing to recover from."""
def require_checkpoints(req: JobRequest) -> None:
    """Refuse a drill on a job that writes no checkpoints: recovery would start from scratch."""
    enabled = False
    if req.config and req.config.endswith(".toml"):
        enabled = bool(read_toml(Path(req.config)).get("checkpoint", {}).get("enable"))
    for item in req.overrides:
        if item.startswith("checkpoint.enable="):
            enabled = item.split("=", 1)[1].strip().lower() == "true"
    if not enabled:
        raise DrillRefused("checkpoint.enable: the job writes no checkpoints (got false), so a drill has nothing to "
                           "recover from; set [checkpoint] enable = true or pass --set checkpoint.enable=true")


def drill(req: JobRequest, fault: str, inject_step: int = 5, ctx: CallContext | None = None,
          progress: Progress | None = None) -> tuple[DrillResult | DetectionOnlyResult, EvidenceRow]:
    """One drill end to end; returns its result and the evidence row for the pack."""
    if fault not in DRILLS:
        raise DrillRefused(f"fault: unknown fault {fault!r}; use one of {', '.join(DRILLS)}")
    require_checkpoints(req)
    if req.framework == "trainops":
        try:
            check_layout(req.with_overrides(LAUNCH_TIME.get(fault, ("", []))[1]))
        except ValueError as exc:  # the layout, before anything is launched or any node is watched
            raise DrillRefused(str(exc)) from None
    if fault in NODE_DRILLS and (req.nodes < 2 or req.scheduler != "slurm"):
        raise DrillRefused(f"fault: {fault} takes a node away from a multi-node job: use --scheduler slurm --nodes 2 "
                           "(or more) on a `trainops sandbox` cluster")
    ctx = skill_context("fault-drill", ctx)
    with NodeTarget(fault) if fault in NODE_DRILLS else RankTarget() as target:
        try:
            return _Drill(req, fault, inject_step, ctx, progress, target).run()
        except Exception:
            target.undo(ctx)
            raise


class _Drill:
    """One drill in flight. Its phases run in order (launch, inject, detect, restart, finish), each a
    method; what a node drill adds (a lost node, its timeline and repair) is the target's."""
    def __init__(self, req: JobRequest, fault: str, inject_step: int, ctx: CallContext, progress: Progress | None,
                 target: RankTarget) -> None:
        self.req, self.fault, self.inject_step, self.ctx, self.target = req, fault, inject_step, ctx, target
        self.say = progress or (lambda _msg: None)
        self.kind, self.interruption, self.ended_at = DRILLS[fault], None, None
        self.rank = min(1, req.nproc * req.nodes - 1)  # not rank 0, where there is another
        self.launch, self.job_id, self.run_dir, self.started, self.submitted_at = req, "", "", 0.0, 0.0

    def run(self) -> tuple[DrillResult | DetectionOnlyResult, EvidenceRow]:
        sched = self.req.scheduler
        self.start()
        injected_at, last_step = self.await_fired() if self.fault in LAUNCH_TIME else self.inject()
        detection = self.detect(injected_at)
        if (recovered := self.await_in_process(injected_at)) is not None:
            return self.finish_in_process(injected_at, last_step, detection, recovered)
        self.end_job()
        if self.fault in DETECTION_ONLY:
            self.record_end(wait_s=60)
            return _detection_only(self.req, self.fault, self.run_dir, last_step, detection, self.started)
        restart = self.restart(detection)
        if restart.job_id != self.job_id:  # the old id is still COMPLETING: its end comes with Slurm's verdict
            self.record_end(wait_s=60)
        detector = self.detector(detection, restart)
        detector += self.target.restarted(restart.job_id, restart.first_step_at, sched, self.ctx)
        status = invoke(jobs.wait_job, jobs.WaitJobInput(job_id=restart.job_id, scheduler=sched,
                                                         timeout_s=self.req.timeout_s), self.ctx)
        detector += self.target.repair(injected_at, self.ctx)
        if restart.drained:
            invoke(jobs.resume_node, jobs.ResumeNodeInput(node=restart.drained, scheduler=sched), self.ctx)
            self.target.note(restart.drained, "resumed (gated resume_node): back in the pool")
        if status.state != "completed":
            raise ToolError("requeue_job", f"drill {self.fault}: the restarted job ended {status.state}; read "
                                           f"{self.run_dir}/logs")
        return self.finish(injected_at, last_step, detection, restart, detector)

    def end_job(self) -> None:
        """Cancel the faulty job, its ranks' processes witnessed first for the record of its end (the
        cancel's job-status observation writes it); a missing record is written through the same path."""
        sched = self.req.scheduler
        interruptions.witness(self.job_id, sched, self.run_dir, drill=True)
        # forced: the survivors of a detected failure are stuck in a collective, a grace period only waits on them
        status = invoke(jobs.cancel_job, jobs.CancelJobInput(job_id=self.job_id, scheduler=sched, force=True), self.ctx)
        # a forced cancel returns once nothing of the job runs; Slurm may hold a job with a dead node
        # COMPLETING until it declares the node down (~10 s): the restart does not wait for that, the
        # record of the end does (record_end)
        self.ended_at = status.ended_at if status.finished else time.time()
        if status.finished:
            self.interruption = interruptions.record_job_end(status, sched)  # the stored record of this end

    def record_end(self, wait_s: float = 0.0) -> None:
        """Record the cancelled job's end once the scheduler has ended it: before the requeue (which
        reuses the id of a job that is over) without waiting, or, for a job still COMPLETING for a
        dead node, waiting up to `wait_s` after the restart went in under a new id."""
        if self.interruption is not None:
            return
        job_id, sched = self.job_id, self.req.scheduler
        if wait_s:
            status = invoke(jobs.wait_job, jobs.WaitJobInput(job_id=job_id, scheduler=sched, timeout_s=wait_s),
                            self.ctx)
        else:
            status = invoke(jobs.job_status, jobs.JobRef(job_id=job_id, scheduler=sched), self.ctx)
        if status.finished:
            self.interruption = interruptions.record_job_end(status, self.req.scheduler)

    def await_in_process(self, injected_at: float) -> MeasuredRecovery | None:
        """With in-process restart on, the job recovers itself: wait for the trainer's recovery
        record (RUN/recoveries.jsonl) instead of cancelling. None: it is off, or the job ended or
        stayed stuck without one (no spare, a lost node), so the requeue takes over."""
        if not supervised_since(self.run_dir, self.submitted_at):
            self.say(f"drill {self.fault}: recovery by requeue, as this job is set up (in-process restart, "
                     "resilience.in_process_restart, is off or does not apply): trainops cancels the job and "
                     "resubmits it from its newest checkpoint")
            return None
        resilience = read_toml(RunFiles(self.run_dir).config).get("resilience", {})
        patience = min(self.req.timeout_s, 2 * float(resilience.get("collective_timeout_s", 60.0)) + 30)
        self.say(f"drill {self.fault}: in-process restart is on; waiting for the job to recover itself")
        deadline = time.time() + patience
        while time.time() < deadline:
            if (found := in_process_recovery(self.run_dir, injected_at)) is not None:
                return found
            if self.job.ended() is not None:
                return in_process_recovery(self.run_dir, injected_at)
            time.sleep(0.05)
        return None

    def finish_in_process(self, injected_at: float, last_step: int, detection,
                          recovered: MeasuredRecovery) -> tuple[DrillResult, EvidenceRow]:
        """The job recovered in its own processes: nothing was cancelled or requeued. The drill checks
        that training went on past the step it resumed from, and that the job then completed."""
        run_dir, sched = self.run_dir, self.req.scheduler
        resumed = recovered.resumed_step or 0
        wait_for(lambda: any(m.rank == 0 and m.step > resumed and m.time >= recovered.first_step_at
                             for m in read_metrics(run_dir)),
                 self.req.timeout_s, f"a step past {resumed} after the in-process restart in {run_dir}", self.job)
        status = invoke(jobs.wait_job, jobs.WaitJobInput(job_id=self.job_id, scheduler=sched,
                                                         timeout_s=self.req.timeout_s), self.ctx)
        detector = (detection.mechanism + false_positives(detection) + self.target.admitted(recovered)
                    + self.target.repair(injected_at, self.ctx))
        if status.state != "completed":
            raise ToolError("drill", f"drill {self.fault}: the job recovered in process but then ended "
                                     f"{status.state}; read {run_dir}/logs")
        self.interruption = interruptions.in_process_record(self.job_id, injected_at)  # wait_job recorded it
        loaded = next((load for load in read_journal(run_dir).loads if load.time > injected_at), None)
        restart = Restart(job_id=self.job_id, drained=None, quarantined=[], started_at=None,
                          isolated_at=detection.detected_at + (recovered.phases_s.get("abort") or 0.0),
                          first_step_at=recovered.first_step_at, loaded=loaded,
                          intact=verify_restored(run_dir, loaded, self.ctx) if recovered.checkpoint else False,
                          fell_back=[e.step for e in read_journal(run_dir).fallbacks if e.time > injected_at])
        return self.finish(injected_at, last_step, detection, restart, detector, recovered)

    def start(self) -> None:
        """Launch the job; a launch-time fault goes in with its overrides, to fire at `inject_step`."""
        if self.fault in LAUNCH_TIME:
            planned = invoke(faults.inject_fault, faults.InjectFaultInput(kind=self.kind, rank=self.rank,
                                                                          step=self.inject_step), self.ctx)
            self.launch = self.req.with_overrides([*LAUNCH_TIME[self.fault][1], *planned.overrides])
        self.say(f"drill {self.fault}: launching")
        self.submitted_at = time.time()
        submitted = submit(self.launch, f"drill-{self.fault}", self.ctx)
        handle, self.spec_sha256 = submitted.handle, submitted.spec_sha256  # an approved requeue names the spec
        self.job_id, self.run_dir, self.started = handle.job_id, handle.run_dir, time.time()
        self.job = JobWatch(self.job_id, self.req.scheduler, self.run_dir, self.ctx, since=self.started)

    def await_fired(self) -> tuple[float, int]:
        """(when, at which step) the trainer fired the launch-time fault, from its own record."""
        fired_kind = LAUNCH_TIME[self.fault][0]
        self.say(f"drill {self.fault}: waiting for the trainer to fire {self.kind}")
        wait_for(lambda: fault_fired(self.run_dir, fired_kind) is not None, self.req.timeout_s,
                 f"the trainer to fire {fired_kind} (faults.jsonl) in {self.run_dir}", self.job)
        fired = fault_fired(self.run_dir, fired_kind)
        return fired.time, fired.step

    def inject(self) -> tuple[float, int]:
        """Inject a runtime fault once the job is past `inject_step` with a committed checkpoint:
        (when, the last step any rank reached)."""
        run_dir = self.run_dir
        wait_for(lambda: heartbeat_step(run_dir) >= self.inject_step and bool(read_journal(run_dir).saves),
                 self.req.timeout_s, f"step {self.inject_step} and a committed checkpoint in {run_dir}", self.job)
        self.say(f"drill {self.fault}: injecting {self.kind}")
        where = self.target.choose(self.job_id, self.rank, self.req.scheduler, self.ctx, run_dir)
        injected_at = self.inject_once(faults.InjectFaultInput(kind=self.kind, run=run_dir, **where))
        self.target.injected(self.kind, injected_at)
        last_step = max(heartbeat_step(run_dir, r) for r in range(self.req.nproc * self.req.nodes))
        if self.kind == "corrupt_checkpoint":  # the damage shows when the job restarts
            kill = faults.InjectFaultInput(kind="kill_rank", run=run_dir, rank=self.rank)
            invoke(faults.inject_fault, kill, self.ctx)
        return injected_at, last_step

    def inject_once(self, inp: faults.InjectFaultInput) -> float:
        """inject_fault; a checkpoint corruption first waits for a write to have just committed, so
        the damaged checkpoint is the newest one the restart reaches (inject_fault corrupts only a
        committed one)."""
        if self.kind == "corrupt_checkpoint":
            between_writes(self.run_dir)
        return invoke(faults.inject_fault, inp, self.ctx).injected_at

    def detect(self, injected_at: float) -> Detection:
        watch = DetectFaultsInput(run=self.run_dir, job_id=self.job_id, scheduler=self.req.scheduler,
                                  poll_interval_s=0.05, injected_at=injected_at, timeout_s=60, fault_kind=self.kind)
        detection = invoke(detection_tool.detect_faults, watch, self.ctx)
        if not detection.detected:
            raise ToolError("detect_faults", f"drill {self.fault}: its own signal ({', '.join(detection.expected)}) "
                                             f"was not seen in {self.run_dir}: {detection.evidence}"
                                             + false_positives(detection))
        self.say(f"drill {self.fault}: detected by {detection.mechanism} after {detection.detection_latency_s:.2f} s; "
                 "isolating")
        self.target.note(detection.node or "job", f"detected: {detection.mechanism} ({detection.evidence})",
                         detection.detected_at)
        return detection

    def restart(self, detection: Detection) -> Restart:
        """Isolate what the detector blames (drain its node where a spare exists; quarantine the
        checkpoints a silent corruption may have reached), requeue, and wait for the first step."""
        sched, run_dir = self.req.scheduler, self.run_dir
        job_nodes = invoke(jobs.job_status, jobs.JobRef(job_id=self.job_id, scheduler=sched), self.ctx).nodes
        drained = isolate_node(detection, job_nodes, sched, self.ctx, self.req.partition)
        if drained:
            self.target.note(drained, "drained (gated drain_node)")
        quarantined = (sdc.respond(run_dir, sdc.Suspect.of(detection), sched, self.ctx).quarantined
                       if detection.mechanism == "checksum_mismatch" else [])  # R-ESC-3: tests, drain, a human
        isolated = time.time()
        # Slurm requeues a job held COMPLETING by a dead node under a new id, whose end is recorded after
        # the restart; every other scheduler reuses the id, so the end must be on record before
        self.record_end(wait_s=0.0 if sched == "slurm" else 60.0)
        requeue = jobs.RequeueJobInput(job_id=self.job_id, scheduler=sched, spec_sha256=self.spec_sha256)
        requeued = invoke(jobs.requeue_job, requeue, self.ctx).job_id
        first_step_at = wait_for_restart(run_dir, isolated, requeued, self.req, self.ctx)
        started_at = invoke(jobs.job_status, jobs.JobRef(job_id=requeued, scheduler=sched), self.ctx).started_at
        journal = read_journal(run_dir)
        loaded = next((load for load in journal.loads if load.time > isolated), None)
        return Restart(job_id=requeued, drained=drained, quarantined=quarantined, isolated_at=isolated,
                       started_at=started_at, first_step_at=first_step_at, loaded=loaded,
                       intact=verify_restored(run_dir, loaded, self.ctx, excluded=set(quarantined)),
                       fell_back=[e.step for e in journal.fallbacks if e.time > isolated])

    def detector(self, detection, restart: Restart) -> str:
        """What caught the fault and what the drill did about it, in one line."""
        line = f"{detection.mechanism}: {detection.evidence}" if self.fault in LAUNCH_TIME else detection.mechanism
        line += false_positives(detection)
        if restart.drained:
            line += f"; drained {restart.drained}, restarted on a spare"
        if restart.quarantined:
            line += f"; quarantined checkpoint(s) {restart.quarantined} taken after the corruption"
        if restart.fell_back:
            line += f"; the restart's checksum check skipped corrupt step(s) {restart.fell_back}"
        return line

    def finish(self, injected_at: float, last_step: int, detection, restart: Restart, detector: str,
               recovered: MeasuredRecovery | None = None) -> tuple[DrillResult, EvidenceRow]:
        """The drill's result, written to RUN/drill.json, and its evidence row; a requeue's path and
        phases are read back from the records (the marks kept in drill.json say which)."""
        record = RunFiles(self.run_dir).drill_record
        loaded = restart.loaded
        ended = self.complete(detection, restart, injected_at, recovered)
        marks = RecoveryMarks(injected_at=injected_at, detected_at=detection.detected_at, ended_at=self.ended_at,
                              requeued_at=restart.isolated_at, started_at=restart.started_at)
        if recovered is None:
            recovered = requeue_recovery(self.run_dir, marks)
        from_step = recovered.resumed_step if recovered.resumed_step is not None else (loaded.step if loaded else 0)
        used = (loaded.path if loaded else f"a peer's memory (step {from_step})" if recovered.path != "requeue"
                else "none (restarted from step 0)")
        recovery_s = (recovered.total_s if recovered.total_s is not None
                      else restart.first_step_at - detection.detected_at)
        result = DrillResult(
            fault=self.fault, run_dir=self.run_dir, injected_at_step=last_step, injected_time=injected_at,
            detected_time=detection.detected_at, isolated_time=restart.isolated_at,
            recovered_time=restart.first_step_at, detection_latency_s=detection.detection_latency_s,
            isolation_granularity=detection.isolation, recovery_time_s=max(0.0, recovery_s),
            steps_lost=max(0, last_step - from_step), checkpoint_used=used,
            async_checkpoint_intact=restart.intact, cause=ended.cause if ended else "unclassified",
            job_id=self.job_id, interruption_id=ended.id if ended else "", detector=detector, drill_record=str(record),
            recovery_path=recovered.path, recovery_phases_s=recovered.phases_s, recovery_unknown=recovered.unknown,
            recovery_basis=recovered.basis)
        fps = [fp.model_dump() for fp in detection.false_positives]
        record.write_text(json.dumps({**result.model_dump(), "false_positives": fps,
                                      "recovery_marks": marks.model_dump(), **self.target.record(injected_at)},
                                     indent=2) + "\n", encoding="utf-8")
        evidence = EvidenceRow(tool="inject_fault+detect_faults+requeue_job", version=self.req.framework_version,
                               command=command_line(self.launch), log_path=str(record),
                               value=f"{self.fault}: detect {result.detection_latency_s:.2f} s, recover "
                               f"{result.recovery_time_s:.1f} s ({phases_line(recovered)}), "
                               f"{result.steps_lost} steps lost"
                               + self.target.evidence(str(record)),
                               window_start=self.started, window_end=time.time())
        return result, evidence

    def complete(self, detection, restart: Restart, injected_at: float, recovered: MeasuredRecovery | None = None):
        """The record of the drill's job end (or in-process recovery), completed with the recovery the
        drill measured (isolation: detected -> isolated; restart: isolated -> first step) and what the
        restart showed. In process, the supervisor's own phases from its detection: abort, then the rest."""
        if self.interruption is None:
            return None
        isolation_s = restart.isolated_at - detection.detected_at
        restart_s = restart.first_step_at - restart.isolated_at
        if recovered is not None and recovered.total_s is not None:
            isolation_s = recovered.phases_s.get("abort") or 0.0
            restart_s = recovered.total_s - isolation_s
        return interruptions.complete_recovery(
            self.interruption.id, detection_s=detection.detection_latency_s, isolation_s=isolation_s,
            restart_s=restart_s, node_states=self.target.node_states(injected_at))


def false_positives(detection) -> str:
    """The findings by another signal before the fault's own, for the detector line: they are not its
    detection, but a reviewer sees what else fired and when."""
    return "".join(f"; false positive: {fp.mechanism} at {fp.after_injection_s:+.2f} s ({fp.evidence})"
                   if fp.after_injection_s is not None else f"; false positive: {fp.mechanism} ({fp.evidence})"
                   for fp in detection.false_positives)


def _detection_only(req: JobRequest, fault: str, run_dir: str, step: int, detection,
                    started: float) -> tuple[DetectionOnlyResult, EvidenceRow]:
    record = Path(run_dir) / "detection.json"
    result = DetectionOnlyResult(fault=fault, run_dir=run_dir, injected_at_step=step,
                                 detection_latency_s=detection.detection_latency_s,
                                 isolation_granularity=detection.isolation,
                                 detector=f"{detection.mechanism}: {detection.evidence}" + false_positives(detection),
                                 false_positives=[fp.model_dump() for fp in detection.false_positives],
                                 recovery=DETECTION_ONLY[fault][0], note=DETECTION_ONLY[fault][1],
                                 drill_record=str(record))
    record.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
    evidence = EvidenceRow(tool="inject_fault+detect_faults", version=req.framework_version, command=command_line(req),
                           log_path=str(record), value=f"{fault}: detect {result.detection_latency_s:.2f} s, isolate "
                           f"{result.isolation_granularity}; recovery not measured: {result.recovery} ({result.note})",
                           window_start=started, window_end=time.time())
    return result, evidence


def run_drills(req: JobRequest, faults: list[str], ctx: CallContext | None = None,
               progress: Progress | None = None) -> tuple[list[DrillResult | DetectionOnlyResult], list[EvidenceRow]]:
    results, evidence = [], []
    for fault in faults:
        result, row = drill(req, fault, ctx=ctx, progress=progress)
        results.append(result)
        evidence.append(row)
    return results, evidence
