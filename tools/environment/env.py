"""Environment declaration: the facts any MFU or scaling claim must be read against.

SOP step S1. Everything here is either read from the machine (nvidia-smi, /proc/cpuinfo,
torch, the scheduler) or measured on it (checkpoint write bandwidth, CPU GEMM peak); each field
says which. This module declares the models, and imports nothing that fills them: the probes
and the `declare_environment` tool that runs them are in `env_probes`, above it. Governance rules
refuse an MFU conclusion that has no declaration behind it.
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from trainops.tools.changes.known_issues import KnownIssue
from trainops.tools.environment.interconnect import InterconnectMeasurement
from trainops.tools.frameworks.base import known_frameworks
from trainops.tools.ids import SafeId
from trainops.tools.schedulers.base import SchedulerKind, partition_problem

SINGLE_HOST_INTERCONNECT = "loopback/shared-memory (single host)"


class ScaleUpDomain(BaseModel):
    gpus: int = Field(description="GPUs reachable from GPU0 over NVLink/NVSwitch, GPU0 included.")
    link: str = Field(description="Link type seen in `nvidia-smi topo -m` (e.g. NV18), or PCIe.")


class Accelerators(BaseModel):
    kind: Literal["gpu", "cpu"] = Field(description="gpu when nvidia-smi lists devices, otherwise cpu.")
    model: str = Field(description="GPU product name, or the CPU model name.")
    count: int = Field(description="GPUs on this host, or logical CPUs this process may use.")
    memory_gib: float | None = Field(None, description="Memory per GPU, GiB (None for CPUs).")
    driver_version: str | None = Field(None, description="NVIDIA driver version.")
    compute_capability: str | None = Field(None, description="CUDA compute capability, e.g. 9.0.")
    scale_up_domain: ScaleUpDomain | None = Field(None, description="From `nvidia-smi topo -m` when present.")
    cpu_sockets: int | None = Field(None, description="CPU sockets (from /proc/cpuinfo).")
    cpu_physical_cores: int | None = Field(None, description="Physical CPU cores (from /proc/cpuinfo).")
    cpu_logical: int = Field(description="Logical CPUs of the host (os.cpu_count()).")


class Software(BaseModel):
    python: str
    torch: str
    cuda: str | None = Field(description="CUDA version torch was built with; None on a CPU build.")
    nccl: str | None = Field(description="NCCL version when torch has CUDA; None otherwise.")
    gloo: bool = Field(description="Whether torch.distributed has the gloo backend.")
    distributed_backend: Literal["nccl", "gloo"] = Field(description="What the trainer uses here.")


class Framework(BaseModel):
    name: str = Field(description="Training framework, e.g. trainops-embedded-trainer, Megatron-LM, torchtitan.")
    version: str = Field(description="Its version; a claim without it is refused.")


class SchedulerDeclaration(BaseModel):
    kind: SchedulerKind
    version: str = Field(description="Scheduler version as it reports itself.")
    partitions: list[str] = Field(description="Partitions (Slurm) or node pools; 'local' for the local scheduler.")
    default_partition: str | None = Field(None, description="The partition a job that names none runs in (Slurm's "
                                                            "`sinfo` marks it '*'); None where there is none.")
    partition_nodes: dict[str, list[str]] = Field(default_factory=dict,
                                                  description="Each partition's nodes, as the scheduler reports them.")
    shadow_partition: str | None = Field(None, description="The shadow / non-production partition the scheduler has, "
                                                           "where policy changes are replayed first (K-PRE-3, "
                                                           "R-SCH-1); None: it has none.")
    nodes: list[str] = Field(description="Nodes the scheduler reports that training jobs can use (the shadow "
                                         "partition's nodes are listed apart).")
    hot_spare_nodes: list[str] = Field(description="Idle training nodes as the scheduler reports them: the pool that "
                                                   "can replace a failed node at once.")
    shadow_nodes: list[str] = Field(default_factory=list,
                                    description="Nodes only in the shadow partition, where policy changes are replayed "
                                                "first (R-SCH-1): never a spare for a training job.")
    cpus_per_node: dict[str, int] = Field(default_factory=dict, description="CPUs each node reports to the scheduler.")
    transport: str = Field("", description="How trainops talks to the scheduler (Slurm: pyslurm or the CLI, and why).")


class CheckpointStorage(BaseModel):
    path: str = Field(description="Where the test file was written (where checkpoints go).")
    filesystem: str = Field(description="Filesystem type of that path, from /proc/mounts.")
    test_size_mib: int = Field(description="Size of the test write, MiB.")
    write_s: float = Field(description="Time to write and fsync the test file, seconds (measured).")
    write_bandwidth_mib_s: float = Field(description="test_size_mib / write_s, MiB/s (measured).")


class ComputePeak(BaseModel):
    peak_tflops: float = Field(description="Peak dense TFLOP/s used as the MFU denominator here.")
    dtype: str = Field(description="Data type of the peak.")
    source: str = Field(description="How it was obtained: measured CPU GEMM (which probe) or a vendor table.")


class EnvironmentDeclaration(BaseModel):
    declared_at: datetime = Field(description="When this declaration was made (UTC).")
    host: str
    accelerators: Accelerators
    hardware_generation: str = Field(description="e.g. Hopper (H100, sm_90), or the CPU architecture and widest vector "
                                                 "ISA.")
    interconnect: str = Field(description="NVLink / InfiniBand when visible, else loopback/shared-memory (single "
                                          "host).")
    software: Software
    framework: Framework
    scheduler: SchedulerDeclaration
    checkpoint_storage: CheckpointStorage
    compute_peak: ComputePeak
    inter_node_all_reduce: InterconnectMeasurement | None = Field(
        None, description="Measured across two of the scheduler's nodes when asked (measure_interconnect).")
    known_issues: list[KnownIssue] = Field(default_factory=list,
                                           description="People's notes (trainops known-issue) about a declared "
                                                       "version: quoted, never acted on.")
    notes: list[str] = Field(default_factory=list,
                             description="What could not be read, and what was declared rather than measured.")


class EnvInput(BaseModel):
    scheduler: SchedulerKind = Field("local",
                                     description="Which scheduler to query for version, partitions and idle nodes.")
    ckpt_dir: str | None = Field(None,
                                 description="An existing folder where checkpoints go, inside the workspace or a "
                                             "[governance] root; default $TRAINOPS_HOME/runs.")
    ckpt_test_mib: int = Field(64, ge=1, le=4096,
                               description="Size of the checkpoint write test, MiB (written to a temporary folder, "
                                           "then removed).")
    framework: str | None = Field(None,
                                  description="Declare a framework other than the embedded trainer: an adapter's name "
                                              "(trainops, deepspeed, torchtitan, megatron) reports its installed "
                                              "version; any other name needs framework_version.")
    framework_version: str | None = Field(None, description="Version of `framework`.")
    partition: SafeId | None = Field(None,
                                     description="Slurm partition the job will run in: refused unless `sinfo` lists "
                                                 "it; the interconnect measurement runs on its nodes. None: the "
                                                 "default partition.")
    measure_interconnect: bool = Field(False,
                                       description="Measure inter-node all-reduce latency and bandwidth: submits a "
                                                   "2-node gloo job through the scheduler (Slurm; ~10 s, its files "
                                                   "are removed).")
    measure_gemm: bool = Field(True,
                               description="Measure the CPU GEMM peak (a fraction of a second); false reports 0 and "
                                           "says so.")

    @model_validator(mode="after")
    def _framework_needs_version(self) -> EnvInput:
        if self.framework and not self.framework_version and self.framework not in known_frameworks():
            raise ValueError(
                f"framework={self.framework!r} has no framework_version: declare the version, e.g. "
                "framework_version='0.12.0'"
            )
        return self

    @model_validator(mode="after")
    def _interconnect_needs_nodes(self) -> EnvInput:
        if self.measure_interconnect and self.scheduler != "slurm":
            raise ValueError(f"measure_interconnect=true needs scheduler='slurm' (got {self.scheduler!r}): the "
                             "measurement is a 2-node job; `trainops sandbox up` makes a Slurm cluster on this host")
        return self

    @model_validator(mode="after")
    def _partition_needs_slurm(self) -> EnvInput:
        if problem := partition_problem(self.partition, self.scheduler):
            raise ValueError(problem)
        return self
