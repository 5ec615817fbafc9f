"""The evidence pack: what a human reads before approving a training-efficiency or
fault-tolerance conclusion. The model is the contract; its JSON schema is exported as
`evidence.schema.json` next to this file."""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from trainops.run_records import RecoveryPath
from trainops.skills.evidence.bottleneck import BottleneckSplit
from trainops.skills.evidence.design import DesignedArm
from trainops.skills.evidence.published import LayoutPlan, MlperfComparison
from trainops.skills.evidence.steps import PackChoice, PackStep
from trainops.tools.changes.framework import SinceApproved
from trainops.tools.changes.known_issues import KnownIssue
from trainops.tools.versions import SoftwareVersions

Verdict = Literal["pass", "fail", "partial"]
Isolation = Literal["rank", "node", "replica_group", "switch", "rack", "job"]
Cause = Literal["hardware", "network", "software", "data", "planned", "hung-peer", "gpu-memory", "host-memory",
                "storage", "configuration", "injected", "unclassified"]  # tools/reliability/causes.py
FaultKind = Literal["crash", "node-loss", "hang", "checkpoint-corruption", "nan", "bitflip", "node-crash", "power-loss",
                    "partition", "slow-network"]

SCHEMA_PATH = Path(__file__).with_name("evidence.schema.json")


class PackEnvironment(BaseModel):
    """What every MFU or scaling conclusion must name (S1)."""

    framework: str = Field(description="training framework, e.g. 'trainops-trainer'")
    framework_version: str = Field(description="framework version string")
    torch_version: str = Field(description="torch.__version__ of the run")
    hardware: str = Field(description="accelerator generation or CPU model, e.g. 'H100-SXM' or 'cpu:x86_64'")
    device_count: int = Field(ge=1, description="devices (or CPU processes) in the declared pool")
    backend: str = Field(description="collective backend: nccl or gloo")
    scheduler: str = Field(description="scheduler name and version, e.g. 'local' or 'slurm 22.05'")
    checkpoint_write_gib_per_s: float | None = Field(default=None, description="measured checkpoint write bandwidth")
    hot_spares: int = Field(default=0, ge=0, description="hot-spare nodes available to the scheduler")
    accelerator_kind: Literal["gpu", "cpu"] | None = Field(default=None, description="what the devices are")
    scale_up_domain: int | None = Field(default=None, description="accelerators per scale-up domain (NVLink), "
                                                                  "declared; None on CPU hosts")
    inter_node_gbit_s: float | None = Field(default=None, description="measured inter-node bandwidth, Gbit/s")
    inter_node_latency_us: float | None = Field(default=None, description="measured inter-node all-reduce latency")
    inter_node_measured_on: list[str] = Field(default_factory=list,
                                              description="the nodes the inter-node all-reduce job ran on")
    partition: str | None = Field(default=None, description="the scheduler partition the job runs in; None: the "
                                                            "scheduler has no partitions (local)")
    partition_nodes: list[str] = Field(default_factory=list, description="that partition's nodes, as the scheduler "
                                                                         "reports them")
    partition_cpus: int | None = Field(default=None, description="CPUs of those nodes together, as the scheduler "
                                                                 "reports them")
    job_nodes: int = Field(default=1, ge=1, description="nodes the job asks for")
    hot_spare_nodes: list[str] = Field(default_factory=list,
                                       description="the hot-spare pool: idle nodes of the job's partition beyond the "
                                                   "job's own, from the scheduler (none on the local scheduler)")
    shadow_partition: str | None = Field(default=None,
                                         description="the shadow / non-production partition the scheduler has "
                                                     "(K-PRE-3): its name, or 'none'; None: not checked")
    monitor: str = Field(default="embedded", description="where step metrics come from: embedded (each run's "
                                                         "metrics.jsonl) or the Prometheus S1 checked")

    def declared_rows(self) -> list[list[str]]:
        """The report's S1 table: what was declared, each as `name, value`."""
        spares = ", ".join(self.hot_spare_nodes) if self.hot_spare_nodes else "none"
        rows = [["framework", f"{self.framework} {self.framework_version}"], ["torch", self.torch_version],
                ["hardware", self.hardware], ["devices in the pool", str(self.device_count)],
                ["collective backend", self.backend], ["scheduler", self.scheduler],
                ["hot spares", f"{self.hot_spares} ({spares})" if self.hot_spares else "0"]]
        return rows + self.placement_rows()

    def placement_rows(self) -> list[list[str]]:
        """Where the job runs (partition, its nodes, the measured interconnect, the shadow partition) and
        what watches it."""
        rows = []
        if self.partition:
            rows += [["partition", f"{self.partition}: {', '.join(self.partition_nodes)} "
                                   f"({self.partition_cpus or '?'} CPUs); the job takes {self.job_nodes}"]]
        if self.inter_node_gbit_s is not None:
            rows += [["inter-node all-reduce", f"{self.inter_node_gbit_s:.2f} Gbit/s, "
                                               f"{self.inter_node_latency_us or 0:.0f} us between "
                                               f"{', '.join(self.inter_node_measured_on)} (measured)"]]
        if self.shadow_partition is not None:
            rows += [["shadow partition", self.shadow_partition]]
        return rows + [["monitor", self.monitor]]


class JobLabels(BaseModel):
    """What an MFU or scaling figure is read against (R-ENV-1), from the job that ran: its RUN/config.toml
    and the world it was launched with, and the environment declaration; `sources` says where each came from."""

    model: str = Field(description="model preset or name, as the run's config gives it")
    parameters: int | None = Field(default=None, description="parameter count of that model; None when unknown")
    precision: str = Field(description="compute precision the run used")
    parallel_layout: str = Field(description="the world size and every parallel degree the run used")
    world_size: int = Field(ge=1, description="ranks the job was launched with")
    global_batch: int | None = Field(default=None, description="sequences per optimizer step, all ranks together")
    framework: str = Field(description="framework, as the environment declaration names it")
    framework_version: str = Field(description="its version, from the environment declaration")
    hardware: str = Field(description="accelerator (or CPU) and generation, from the environment declaration")
    seq_len: int | None = Field(default=None, ge=1, description="tokens per sequence the run trained on; None when "
                                                                "its config does not say")
    architecture: Literal["dense", "moe"] | None = Field(
        default=None, description="dense, or a mixture of experts (A-ENV-3); None when the run folder does not say")
    experts: int | None = Field(default=None, ge=2, description="MoE: experts per MoE layer")
    top_k: int | None = Field(default=None, ge=1, description="MoE: experts each token is routed to")
    sources: dict[str, str] = Field(default_factory=dict, description="label -> where it was read from")

    @model_validator(mode="after")
    def _structure_is_whole(self) -> "JobLabels":
        """An MoE label without its experts and top-k (or a dense one with them) would mislabel the figure."""
        if self.architecture == "moe" and (self.experts is None or self.top_k is None):
            raise ValueError(f"architecture='moe' needs experts and top_k (got experts={self.experts}, "
                             f"top_k={self.top_k}): read both from the run's config")
        if self.architecture != "moe" and (self.experts is not None or self.top_k is not None):
            raise ValueError(f"architecture={self.architecture!r} has no experts or top_k (got experts="
                             f"{self.experts}, top_k={self.top_k}): label the run architecture='moe', or drop them")
        if self.top_k is not None and self.experts is not None and self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} exceeds experts={self.experts}: a token is routed to at most every "
                             "expert")
        return self

    def structure(self) -> str:
        """The declared model structure in words, as the report shows it beside the model."""
        kind = {"dense": "dense", "moe": f"MoE, {self.experts} experts, top-{self.top_k}",
                None: "dense or MoE not in the run folder"}[self.architecture]
        return f"{kind}, seq_len {self.seq_len if self.seq_len is not None else 'not in the run folder'}"


class MetricSpread(BaseModel):
    median: float = Field(description="median over repeats")
    low: float = Field(description="smallest repeat value")
    high: float = Field(description="largest repeat value")
    spread_pct: float = Field(ge=0, description="(high - low) / median, in percent: the run-to-run noise band")


class ReliabilitySummary(BaseModel):
    """S2's reliability figures, measured from the workspace's interruption record; the MTBF is the
    declared one only while the record is too short, and `mtbf_source` says which."""

    as_of: float = Field(description="unix time the record was read")
    interruptions: int = Field(ge=0, description="recorded job ends that were not a clean finish")
    unplanned: int = Field(ge=0, description="of those, the ones not planned (an operator's stop is planned)")
    span_h: float = Field(ge=0, description="hours from the first to the last unplanned interruption")
    interruption_rate_per_day: float | None = Field(description="unplanned interruptions per day; None: too few")
    mtbf_h: float = Field(gt=0, description="mean time between failures, hours")
    mtbf_source: str = Field(description="measured from N recorded interruptions, or declared by the operator, or "
                                         "the assumed default (and why)")
    mtbf_measured: bool = Field(description="the MTBF comes from the record, not a declared or assumed figure")
    mtbf_level: Literal["measured", "declared", "assumed default"] = Field(
        description="the MTBF's evidence level: from the record, the operator's --mtbf-h, or the assumed default")
    recovery_time_s: float | None = Field(description="median time lost per unplanned interruption; None: none")
    cause_distribution: dict[str, int] = Field(description="interruptions per cause, from the record")
    ettr_window_s: float = Field(gt=0, description="width of one effective-training-time window")
    ettr_pct: list[float] = Field(default_factory=list, description="ETTR per closed window, oldest first")


class BaselineSummary(BaseModel):
    """S2: the default configuration measured with repeats, warm-up steps excluded."""

    model: str = Field(description="model preset or dims")
    parallel_layout: str = Field(description="e.g. 'dp_shard=2 tp=1 pp=1'")
    precision: str = Field(description="fp32 or bf16")
    repeats: int = Field(ge=1, description="independent runs measured")
    warmup_steps_excluded: int = Field(ge=0, description="leading steps dropped from every repeat")
    step_time_s: MetricSpread
    tokens_per_s: MetricSpread
    mfu_pct: MetricSpread
    peak_source: str = Field(description="where the peak FLOP/s came from: vendor table or measured GEMM")
    data_wait_share_pct: float = Field(ge=0, le=100, description="share of step time spent waiting for data")
    comm_share_pct: float | None = Field(
        default=None, ge=0, le=100, description="communication time: share of profiled step time in collectives "
                                                "(overlapped with compute or not); None when not measurable")
    comm_share_method: str = Field(default="", description="how comm_share_pct was measured")
    exposed_comm_share_pct: float | None = Field(
        default=None, ge=0, le=100, description="exposed communication: share of profiled step time in collectives "
                                                "while no compute ran, from the same traces; None when not measurable")
    bottleneck: BottleneckSplit | None = Field(
        default=None, description="compute / exposed communication / data loading / scheduling shares of wall time")
    run_dirs: list[str] = Field(description="the baseline runs, one per repeat")
    labels: JobLabels | None = Field(default=None, description="the labels above, read from the job that ran")
    reliability: ReliabilitySummary | None = Field(
        default=None, description="interruption rate, MTBF and recovery time from the interruption record")


class LadderStop(BaseModel):
    """Where a rollout ladder stopped because the gain was gone, why, and the rollback's proof: the
    job config back at the baseline value, a verification run at that rung against its band."""

    rung: str = Field(description="the rung where the gain was gone, e.g. '4 processes' or '2 nodes x 2 processes'")
    reason: str = Field(description="why the ladder stopped there")
    topology_hint: str = Field(description="what changed in the topology at this rung that may explain it")
    reverted_to: str = Field(description="the baseline value the job config went back to")
    verification_runs: list[str] = Field(default_factory=list, description="run folders of the reverted config")
    verification_change_pct: float = Field(description="MFU change of the reverted runs against the rung's baseline")
    verification_band_pct: float = Field(ge=0, description="the rung's noise band the verification is judged in")
    verification_matches: bool = Field(description="the reverted config matches the baseline within the band")
    human_item: str = Field(default="", description="the pending R-ESC-2 hand-over the stop became")


class AblationRow(BaseModel):
    """One single-variable arm against the baseline at one rung of the rollout ladder (S3/S4)."""

    knob: str = Field(description="catalogue name of the changed variable")
    value: str = Field(description="value in this arm")
    baseline_value: str = Field(description="value in the baseline")
    category: str = Field(description="communication-overlap | kernels | data-pipeline | batch | memory | parallelism")
    scale: str = Field(description="scale condition, e.g. 'tiny, 2 procs'")
    scale_kind: Literal["small", "target"]
    mfu_change_pct: float = Field(description="relative change of the job's MFU vs the baseline median, percent: "
                                              "steps per second at the slowest rank (skills.rollout.job_rates)")
    noise_band_pct: float = Field(ge=0, description="run-to-run noise band at this scale, percent")
    beyond_noise: bool = Field(description="|mfu_change_pct| exceeds the noise band")
    verdict: Literal["gain", "regression", "within-noise"]
    vanished_at_scale: bool = Field(
        default=False, description="a gain at a lower rung that is gone at this one (at or below the noise band)")
    world_size: int | None = Field(default=None, ge=1, description="ranks at this rung (nodes x processes per node)")
    ladder_note: str = Field(default="", description="first rung: what the ladder could not run below it, and why")
    stop: LadderStop | None = Field(default=None, description="the ladder stopped at this rung and rolled back")
    weak_scaling_efficiency_pct: float | None = Field(
        default=None, ge=0, description="target rows: per-process tokens/s of the arm at target over small scale, "
                                         "the global batch grown with the world size")
    scaling_basis: str = Field(default="", description="target rows: the global batch at each scale behind the "
                                                       "scaling figure")
    labels: JobLabels | None = Field(default=None, description="the arm's labels at this scale, from its run")
    source_run: str = Field(description="run folder of the arm's median repeat")
    baseline_run: str = Field(description="run folder of the baseline at this rung (its first repeat): the config "
                                          "the arm changes exactly one setting of (R-ABL-1)")
    reference: str = Field(default="", description="published comparison, with source and scale difference")

    @model_validator(mode="after")
    def _verdict_matches_numbers(self) -> "AblationRow":
        expected = ablation_verdict(self.mfu_change_pct, self.noise_band_pct)
        if self.verdict != expected or self.beyond_noise != (expected != "within-noise"):
            raise ValueError(
                f"ablation row {self.knob}={self.value}: verdict {self.verdict!r} does not follow from "
                f"mfu_change_pct={self.mfu_change_pct} and noise_band_pct={self.noise_band_pct} "
                f"(expected {expected!r}); recompute with trainops.skills.ablation.ablation_verdict"
            )
        return self


def ablation_verdict(mfu_change_pct: float, noise_band_pct: float) -> str:
    """A gain counts only beyond the run-to-run noise band."""
    if abs(mfu_change_pct) <= noise_band_pct:
        return "within-noise"
    return "gain" if mfu_change_pct > 0 else "regression"


class DrillResult(BaseModel):
    """One injected fault, timed from injection to the first completed step after restart (S5)."""

    fault: FaultKind
    run_dir: str
    injected_at_step: int = Field(ge=0)
    injected_time: float = Field(description="unix time of the injection")
    detected_time: float = Field(description="unix time the detector flagged the fault")
    isolated_time: float = Field(description="unix time the faulty unit was excluded")
    recovered_time: float = Field(description="unix time of the first completed step after restart")
    detection_latency_s: float = Field(ge=0)
    isolation_granularity: Isolation
    recovery_time_s: float = Field(ge=0, description="detection -> first completed step after restart")
    steps_lost: int = Field(ge=0)
    checkpoint_used: str = Field(description="checkpoint folder the restart loaded")
    async_checkpoint_intact: bool = Field(description="the restored checkpoint verified complete")
    cause: Cause = Field(description="what the drill's job end reads from its evidence alone (the interruption "
                                     "record's cause); the fault itself was injected by trainops, as its drill "
                                     "record says")
    job_id: str = Field("", description="the drill's job")
    interruption_id: str = Field("", description="the interruption record of the drill's job end")
    detector: str = Field(description="which signal caught it: exit code, heartbeat, loss check, step-time outlier")
    drill_record: str = Field(description="the drill's JSON record (RUN/drill.json) these figures come from")
    recovery_path: RecoveryPath | None = Field(
        default=None, description="how the job recovered; None: its records do not say")
    recovery_phases_s: dict[str, float | None] = Field(
        default_factory=dict, description="seconds per phase of that path, in order (in-process: detect, abort, "
        "admit, load, first_step; requeue: detect, cancel, submit, queue, start, load, first_step); None: unknown")
    recovery_unknown: list[str] = Field(default_factory=list, description="phases the records cannot tell, and why")
    recovery_basis: str = Field(default="", description="the records the path and phases were read from")


class FaultToleranceReport(BaseModel):
    drills: list[DrillResult]
    cause_distribution: dict[str, int] = Field(description="the drills' job ends per cause, from the interruption "
                                                           "record (tools/interruptions.cause_distribution)")


class CheckpointPlan(BaseModel):
    """Interval from the drill's measured checkpoint cost and recovery time (Young/Daly)."""

    save_stall_s: float = Field(description="median training stall per checkpoint, measured in the drill run")
    write_s: float = Field(description="median time for a checkpoint to become durable, measured")
    restart_s: float = Field(description="detection -> training again, measured in the drill")
    restart_path: str = Field(default="", description="the recovery path that restart time is of")
    restart_source: str = Field(default="", description="where restart_s was read from")
    mtbf_h: float = Field(gt=0, description="job mean time between failures used, hours")
    mtbf_basis: str = Field(description="where the MTBF comes from: measured, declared by the operator, or the "
                                        "assumed default")
    mtbf_level: Literal["measured", "declared", "assumed default"] | None = Field(
        default=None, description="the MTBF's evidence level, typed (S2's mtbf_level); None: a plan written before it")
    young_interval_min: float
    daly_interval_min: float
    expected_waste_pct: float = Field(description="expected share of wall time lost at the Daly interval")
    recommendation: str
    checkpoint_bytes: int | None = Field(default=None, description="median bytes per checkpoint, measured")
    write_bandwidth_mib_s: float | None = Field(default=None, description="write bandwidth the saves reached")
    write_occupancy_pct: float | None = Field(
        default=None, description="checkpoint write time per Daly interval over the interval: the share of the "
                                  "storage's write bandwidth the plan occupies")


class EvidenceRow(BaseModel):
    tool: str
    version: str
    command: str
    log_path: str
    value: str
    window_start: float = Field(description="unix time the measurement began")
    window_end: float = Field(description="unix time the measurement ended")


class EmergencyChange(BaseModel):
    """A policy, quota or upgrade change that landed as an emergency (outside the change windows)."""

    tool: str
    time: float = Field(description="unix time the change landed (its audit log entry)")
    target: str = Field(description="what it changed: the tenant, partition or framework, from its input")
    approvers: list[str] = Field(description="the distinct humans who signed it")
    input_sha256: str


class ChangeWindowsNote(BaseModel):
    """R-CHG-1 for the reviewer: the change windows in force when the pack was built, and every
    change that landed as an emergency while the pack's runs ran."""

    summary: str = Field(description="the windows, where they are set, or that none is set")
    windows: list[str] = Field(default_factory=list)
    since: float | None = Field(description="unix time the pack's first run began; emergencies from then on")
    emergency_changes: list[EmergencyChange] = Field(default_factory=list)


EvidenceLevel = Literal["measured", "derived", "declared", "assumed default"]


class PackFigure(BaseModel):
    """One figure of the pack, defined once: every section, plot and answer quotes `shown`
    (skills/evidence/figures.py computes the table when the pack is assembled)."""

    name: str = Field(description="the figure's name, unique in the pack; the report quotes it with its value")
    value: float = Field(description="the value, in `unit`")
    unit: str = Field(description="the unit, e.g. 's', 'MiB/s', '% of profiled step time'")
    shown: str = Field(description="value and unit as every section of the report writes them")
    definition: str = Field(description="what the figure is, told apart from the figures it could be confused with")
    method: str = Field(description="how it was obtained: the tool, the records and the runs it comes from")
    level: EvidenceLevel = Field(description="measured; derived (computed from measured figures); declared by the "
                                             "operator; or an assumed default")
    section: str = Field(description="the report section it belongs to: s1, s2, s5")


class EvidencePack(BaseModel):
    """Everything a human needs to approve or reject the SOP's conclusions."""

    pack_id: str
    created_time: float
    verdict: Verdict
    blockers: list[str] = Field(default_factory=list, description="what stops a 'pass'; empty only for pass")
    environment: PackEnvironment | None = Field(description="S1; required for any MFU or scaling conclusion")
    baseline: BaselineSummary | None = None
    ablations: list[AblationRow] = Field(default_factory=list)
    fault_tolerance: FaultToleranceReport | None = None
    checkpoint_plan: CheckpointPlan | None = None
    evidence: list[EvidenceRow] = Field(default_factory=list)
    awaiting_human: list[str] = Field(default_factory=list, description="decisions left to a person")
    rollback: str = Field(default="", description="how to return to the baseline configuration")
    references: list[str] = Field(
        default_factory=list, description="published results to compare with, each with source and scale difference")
    mlperf: MlperfComparison | None = Field(default=None, description="S7: same-generation MLPerf Training results")
    layout_plan: LayoutPlan | None = Field(default=None, description="the parallel-strategy plan on the declared "
                                                                     "topology")
    figures: list[PackFigure] = Field(default_factory=list, description="every figure of the pack once: name, value, "
                                      "unit, definition, method and evidence level; the report quotes these")
    versions: SoftwareVersions | None = Field(default=None, description="trainops (and its git commit), torch and "
                                              "the scheduler the pack was built with; torch and the scheduler as the "
                                              "environment declared them")
    change_windows: ChangeWindowsNote | None = Field(default=None, description="R-CHG-1: the change windows and the "
                                                                               "emergency changes during the runs")
    ablation_design: list[DesignedArm] = Field(default_factory=list, description="S3: the candidate arms ranked by "
                                               "expected gain from the baseline's measured split, each with the "
                                               "figure it acts on, its bound and why")
    since_approved: SinceApproved | None = Field(default=None, description="K-IN-3: the declared versions against "
                                                 "the newest approved pack's; an upgrade makes its figures another "
                                                 "environment's")
    known_issues: list[KnownIssue] = Field(default_factory=list, description="people's notes (trainops known-issue) "
                                           "about a declared version, quoted")
    sop_steps: list[PackStep] = Field(default_factory=list, description="S1..S6 as the session recorded them, each "
                                      "with the audit line of its call (empty: a pack built from runs, or before)")
    choices: list[PackChoice] = Field(default_factory=list, description="the arms, their order, the drills and the "
                                      "rollout stops: who chose each (planner, model, human) and the reason given")

    @model_validator(mode="after")
    def _consistent(self) -> "EvidencePack":
        if self.environment is None and (self.baseline or self.ablations):
            raise ValueError(
                "environment: missing (got None) but the pack makes MFU claims; "
                "declare the environment first (trainops env / tool declare_environment)"
            )
        if self.verdict == "pass" and self.blockers:
            raise ValueError(f"verdict: 'pass' with blockers {self.blockers}; use 'partial' or 'fail'")
        if self.verdict != "pass" and not self.blockers:
            raise ValueError(f"blockers: empty for verdict {self.verdict!r}; name what stops a pass")
        return self
