"""An SOP session: the record trainops writes of which SOP steps ran, with which results.

`$TRAINOPS_HOME/sop-sessions/ID.json` holds the settings the session was declared with and every
step's typed result (the declaration, each rung's baseline runs and S2's summary, each arm's rows
and runs, the drills, the pack); every write is bound to the audit chain (tools.governance.written)
and a session whose bytes are not the ones trainops last wrote is refused, so the pack (S6) is
built from what the steps measured, never from figures someone typed. The order rules read it:
what each step needs first (`missing`) is the one place the SOP's order is written down.
"""
from __future__ import annotations

import os
import secrets
import time
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from trainops.run_folder import read_regular
from trainops.skills.baseline import RepeatResult
from trainops.skills.evidence.design import DesignedArm
from trainops.skills.evidence.model import (
    AblationRow,
    BaselineSummary,
    DrillResult,
    EvidenceRow,
    PackEnvironment,
)
from trainops.skills.evidence.published import LayoutPlan
from trainops.skills.request import JobRequest
from trainops.tools.context import effective_context
from trainops.tools.frameworks import get_adapter
from trainops.tools.frameworks.base import FrameworkName, SopPlan
from trainops.tools.governance.gate import open_intent
from trainops.tools.governance.written import unbound, write_bound
from trainops.tools.ids import SafeId
from trainops.tools.monitoring.base import MonitorKind
from trainops.tools.planning.layout_mapping import MoeShape
from trainops.tools.schedulers.base import partition_problem
from trainops.workspace import check_id, home

SESSION_KIND = "sop_session_written"
MAX_SESSION_BYTES = 16 << 20
Step = Literal["S1", "S2", "S3", "S4", "S5", "S6"]
NODE_LOSS = "node-crash"
"""The node loss a multi-node SOP drills (skills.drill's NODE_DRILLS): a node of the job's partition is
crashed under it, the job requeued onto a spare from its newest checkpoint."""


class SopSettings(BaseModel):
    """How much of the SOP to run; `quick` trades repeats and arms for time. Arms, drills and the
    small job default to the framework adapter's `sop_plan` (trainops.tools.frameworks)."""
    config: str | None = Field(None,
                               description="job config (TOML; for megatron the pretrain_gpt.py path); None uses the "
                                           "embedded defaults")
    quick: bool = Field(False, description="fewer repeats, one arm, one drill (~2 minutes on 2 CPU cores)")
    scheduler: str = Field("local", description="local, slurm or kubernetes")
    knobs: list[str] = Field(default_factory=list,
                             description="arms NAME=VALUE; empty uses the framework's default plan")
    faults: list[str] = Field(default_factory=list, description="drill kinds; empty uses the framework's default set")
    mtbf_h: float | None = Field(None, gt=0, description="declared job MTBF, hours: used only while the "
                                 "interruption record is too short to measure one; None: the assumed default, "
                                 "labelled so")
    ettr_window_s: float = Field(3600.0, gt=0, le=30 * 86400,
                                 description="width of one effective-training-time window (seconds) for S2 and "
                                             "R-ESC-1")
    framework: FrameworkName = Field("trainops",
                                     description="whose job: trainops (embedded trainer), deepspeed, torchtitan or "
                                                 "megatron")
    moe: MoeShape | None = Field(None, description="a mixture-of-experts shape to budget expert parallelism for in "
                                                   "the parallel-strategy plan (on paper)")
    nodes: int = Field(1, ge=1, le=64, description="nodes the job runs on: one runs 2 ranks, several run one rank "
                                                   "each (the ladder: 1 process, then the nodes); more than one needs "
                                                   "scheduler='slurm'")
    partition: SafeId | None = Field(None, description="Slurm partition the job runs in (S1 refuses one `sinfo` does "
                                                       "not list); None: the cluster's default")
    monitor: MonitorKind = Field("embedded", description="where step metrics are watched: embedded (each run's "
                                                         "metrics.jsonl) or prometheus (S1 checks it answers)")

    @model_validator(mode="after")
    def _cluster_needs_slurm(self) -> SopSettings:
        """nodes > 1 and a partition only mean something to a Slurm cluster: refused elsewhere, naming the fix."""
        if self.nodes > 1 and self.scheduler != "slurm":
            raise ValueError(f"nodes={self.nodes} needs scheduler='slurm' (got {self.scheduler!r}): the "
                             f"{self.scheduler} scheduler runs a job on one node; use scheduler='slurm' (`trainops "
                             "sandbox up` makes a Slurm cluster on this host) or nodes=1")
        if problem := partition_problem(self.partition, self.scheduler):
            raise ValueError(problem)
        return self

    def _plan(self) -> SopPlan:
        return get_adapter(self.framework).sop_plan

    def repeats(self) -> int:
        return 2 if self.quick else 3

    def candidates(self) -> list[str]:
        """The arms S3 ranks: the user's, else the framework's default plan."""
        return self.knobs or list(self._plan().arms)

    def plan(self, design: list[DesignedArm]) -> list[str]:
        """The arms S4 runs in the design's order; the quick SOP keeps the first-ranked default arm."""
        arms = [arm.arm for arm in design]
        return arms if self.knobs or not self.quick else arms[:1]

    def drills(self) -> list[str]:
        """The user's faults, else the framework's (the quick SOP: its first); a job on several Slurm nodes
        drills a node loss too (NODE_LOSS), in the quick SOP instead of the first process fault."""
        if self.faults:
            return list(self.faults)
        faults = list(self._plan().faults)
        if self.nodes > 1:
            return [NODE_LOSS] if self.quick else [*faults, NODE_LOSS]
        return faults[:1] if self.quick else faults

    def drill_overrides(self) -> list[str]:
        """Checkpoint often and stop at step 12, so a fault at step 5 has a checkpoint to return to."""
        return [*self._plan().drill, f"{self._plan().steps_key}=12"]

    def request(self) -> JobRequest:
        steps = 10 if self.quick else 20
        plan = self._plan()
        return JobRequest(config=self.config, preset=None if self.config else "tiny", scheduler=self.scheduler,
                          framework=self.framework, nodes=self.nodes, partition=self.partition,
                          nproc=2 if self.nodes == 1 else 1,
                          overrides=[] if self.config else [f"{plan.steps_key}={steps}", *plan.job])


class StepFigure(BaseModel):
    """One figure of a step's result, a row of the table chat shows as the step lands."""
    name: str
    value: str = Field(description="the figure with its unit, as the step measured it")


class StepLog(BaseModel):
    """One step call as it landed: which step, by which tool, what it found and the runs it launched."""
    step: Step
    tool: str
    at: float = Field(description="Unix seconds when the step's result was recorded")
    result: str = Field(description="the step's finding in one line")
    runs: list[str] = Field(default_factory=list, description="run ids the step launched")
    by: str = Field("", description="who called the step, as the audit log names the caller: the offline plan "
                                    "(skill:... for the operator or agent that ran `trainops sop`), the operator, "
                                    "the agent")
    call: str = Field("", description="the audit entry (intent hash) of the gated call that ran the step; empty: "
                                      "it ran outside the gate, so the pack flags it")
    figures: list[StepFigure] = Field(default_factory=list, description="the step's figures, one row each")
    reason: str = Field("", description="why the caller chose the step's arm or drill, in its own words; empty: "
                                        "none given")


SteerChange = Literal["add_arm", "skip_arm", "add_drill", "skip_drill", "skip_step", "stop_after"]


class Steer(BaseModel):
    """A change to the SOP's plan between steps (skills.sop_steer), as it was asked and who asked."""
    change: SteerChange
    value: str = Field(description="the arm NAME=VALUE, the drill's fault, or the step S1..S6")
    reason: str
    by: str = Field(description="the caller as the audit log names it")
    at: float
    approved_call: str | None = Field(None, description="the human approval the steer ran under (an agent's steer "
                                                        "waits for one); None: an operator's own")

    @property
    def by_a_human(self) -> bool:
        return self.approved_call is not None or not self.by.endswith("agent")


class ArmRung(BaseModel):
    """One arm at one rung of its ladder (S4): the row it earned and the runs behind it."""
    arm: str = Field(description="NAME=VALUE")
    world: int = Field(ge=1, description="ranks at this rung")
    row: AblationRow
    runs: list[RepeatResult]
    evidence: list[EvidenceRow]
    stopped: bool = Field(description="the ladder ends here (no gain, or the gain gone and rolled back)")


class SopSession(BaseModel):
    """Every step's typed result, as trainops recorded it."""
    session_id: str
    created: float
    settings: SopSettings
    environment: PackEnvironment | None = None
    environment_row: EvidenceRow | None = None
    framework_version: str = "undeclared"
    layout: LayoutPlan | None = None
    baselines: dict[int, list[RepeatResult]] = Field(default_factory=dict, description="baseline runs by world size")
    summary: BaselineSummary | None = Field(None, description="S2 at the target scale, with its bottleneck split")
    baseline_evidence: list[EvidenceRow] = Field(default_factory=list)
    design: list[DesignedArm] = Field(default_factory=list, description="S3: the arms ranked from S2's split")
    arms: list[ArmRung] = Field(default_factory=list)
    drills: list[DrillResult] = Field(default_factory=list, description="drills that recovered")
    drill_evidence: list[EvidenceRow] = Field(default_factory=list)
    drilled: list[str] = Field(default_factory=list, description="faults drilled (S5), recovered or detection only")
    pack: str | None = None
    steps: list[StepLog] = Field(default_factory=list)
    approved_call: str | None = Field(None, description="the call id of the human approval its S1 declaration ran "
                                                        "under; None: declared without one (skills.sop_approval)")
    steers: list[Steer] = Field(default_factory=list, description="changes to the plan asked between steps")

    def _steered(self, change: SteerChange) -> list[str]:
        return [s.value for s in self.steers if s.change == change]

    def _planned(self, step: str, planned: list[str], what: str) -> list[str]:
        """A step's items: the plan's, then the ones a steer added, less the ones a steer skipped; none
        when a steer skipped the step."""
        if step in self._steered("skip_step"):
            return []
        items = dict.fromkeys([*planned, *self._steered(f"add_{what}")])
        return [item for item in items if item not in self._steered(f"skip_{what}")]

    def arms_to_run(self) -> list[str]:
        """S4's arms, in S3's order, as steered."""
        return self._planned("S4", self.settings.plan(self.design), "arm")

    def drills_to_run(self) -> list[str]:
        """S5's faults, as steered."""
        return self._planned("S5", self.settings.drills(), "drill")

    def stops_after(self) -> str | None:
        """The earliest step a steer said to stop after (the pack follows it), None to run them all."""
        return min(self._steered("stop_after"), default=None)

    def request(self) -> JobRequest:
        """The job every step launches, loaded once per step and stamped with S1's versions."""
        req = self.settings.request().loaded()
        declared = self.environment.partition if self.environment and req.scheduler == "slurm" else None
        partition = req.partition or declared  # the partition S1 declared (the default one, read from sinfo)
        return req.model_copy(update={"framework_version": self.framework_version, "partition": partition})

    def target_world(self) -> int:
        req = self.settings.request()
        return req.nproc * req.nodes

    def rungs_of(self, arm: str) -> list[ArmRung]:
        return sorted((a for a in self.arms if a.arm == arm), key=lambda a: a.world)

    def logged(self, step: Step, tool: str, result: str, runs: list[str] = (),
               figures: list[tuple[str, str]] = (), reason: str | None = None) -> SopSession:
        log = StepLog(step=step, tool=tool, at=time.time(), result=result, by=effective_context(None).label,
                      runs=[os.path.basename(r) for r in runs], call=open_intent() or "",
                      figures=[StepFigure(name=name, value=value) for name, value in figures], reason=reason or "")
        return self.model_copy(update={"steps": [*self.steps, log]})


def sessions_dir():
    folder = home() / "sop-sessions"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def start(settings: SopSettings) -> SopSession:
    return SopSession(session_id=f"sop-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}",
                      created=time.time(), settings=settings)


def save(session: SopSession) -> SopSession:
    """Write the session (atomically) and bind its bytes to the audit chain, naming the last step and
    the call it ran in (what the pack checks each step against)."""
    last = session.steps[-1] if session.steps else None
    write_bound(sessions_dir() / f"{session.session_id}.json", SESSION_KIND, session.session_id,
                session.model_dump_json(indent=1).encode("utf-8"), step=last and last.step, call=last and last.call)
    return session


def load(session_id: str) -> SopSession:
    """The session as trainops last wrote it; a missing, edited or hand-made one is a ValueError
    naming the fix."""
    check_id("session", session_id)
    data = read_regular(sessions_dir() / f"{session_id}.json", MAX_SESSION_BYTES)
    if data is None:
        raise ValueError(f"session: no SOP session {session_id!r} in {sessions_dir()}; start one with sop_declare "
                         "(S1)")
    problem = unbound(SESSION_KIND, session_id, data)
    if problem:
        raise ValueError(f"session: {problem}; its results are not evidence: start a new session with sop_declare")
    try:
        return SopSession.model_validate_json(data)
    except ValidationError as exc:
        raise ValueError(f"session: {session_id} is not an SOP session trainops wrote ({exc.errors()[0]['msg']}); "
                         "start a new session with sop_declare") from None
