"""Environment declaration: the facts any MFU or scaling claim must be read against.

SOP step S1. Everything here is either read from the machine (nvidia-smi, /proc/cpuinfo,
torch, the scheduler) or measured on it (checkpoint write bandwidth, CPU GEMM peak); each field
says which. Governance rules refuse an MFU conclusion that has no declaration behind it.
"""
from __future__ import annotations

import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from trainops.tools.base import ToolError, tool
from trainops.tools.interconnect import InterconnectMeasurement, declare_interconnect

SchedulerKind = Literal["local", "slurm", "kubernetes"]
SINGLE_HOST_INTERCONNECT = "loopback/shared-memory (single host)"
EMBEDDED_FRAMEWORK = "trainops-embedded-trainer"

# GPU product names -> architecture generation (the MFU denominator depends on it).
_GPU_GENERATIONS = (
    (r"GB200|B200|B100|GB300|B300", "Blackwell"),
    (r"H100|H200|H800|H20|GH200", "Hopper"),
    (r"L40|L4\b|RTX 40|RTX 6000 Ada", "Ada Lovelace"),
    (r"A100|A800|A10\b|A30|A40|RTX 30", "Ampere"),
    (r"V100", "Volta"),
    (r"MI300|MI325", "CDNA 3"),
)


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
    nodes: list[str] = Field(description="Nodes the scheduler reports.")
    hot_spare_nodes: list[str] = Field(description="Idle nodes as the scheduler reports them: the pool that can "
                                                   "replace a failed node at once.")
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
    measure_interconnect: bool = Field(False,
                                       description="Measure inter-node all-reduce latency and bandwidth: submits a "
                                                   "2-node gloo job through the scheduler (Slurm; ~10 s, its files "
                                                   "are removed).")
    measure_gemm: bool = Field(True,
                               description="Measure the CPU GEMM peak (a fraction of a second); false reports 0 and "
                                           "says so.")

    @model_validator(mode="after")
    def _framework_needs_version(self) -> EnvInput:
        from trainops.tools.frameworks.base import known_frameworks

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


def _run(cmd: list[str], timeout_s: float = 15) -> str | None:
    """Output of a command, or None when it is missing or fails (absence is a fact, not an error)."""
    if shutil.which(cmd[0]) is None:
        return None
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_gpu_query(csv_text: str) -> list[dict[str, str | float | None]]:
    """Rows of `nvidia-smi --query-gpu=name,memory.total,driver_version[,compute_cap] --format=csv,noheader,nounits`."""
    rows = []
    for line in csv_text.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        memory = parts[1] if len(parts) > 1 else ""
        rows.append({
            "name": parts[0],
            "memory_gib": round(float(memory) / 1024, 1) if memory.replace(".", "", 1).isdigit() else None,
            "driver": parts[2] if len(parts) > 2 else None,
            "compute_cap": parts[3] if len(parts) > 3 and parts[3][:1].isdigit() else None,
        })
    return rows


def _query_gpus() -> list[dict[str, str | float | None]]:
    """Older drivers do not know compute_cap: ask again without it rather than miss the GPUs."""
    for fields in ("name,memory.total,driver_version,compute_cap", "name,memory.total,driver_version"):
        text = _run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
        if text and text.strip():
            return parse_gpu_query(text)
    return []


def parse_topology(topo_text: str) -> ScaleUpDomain | None:
    """GPU0's row of `nvidia-smi topo -m`: the GPUs it reaches over NV# links form its scale-up domain."""
    rows = [line.split() for line in topo_text.splitlines() if line.strip()]
    header = next((r for r in rows if r[0] == "GPU0" and "X" not in r), None)
    gpu0 = next((r for r in rows if r[0] == "GPU0" and len(r) > 1 and r[1] == "X"), None)
    if header is None or gpu0 is None:
        return None
    n_gpus = next((i for i, cell in enumerate(header) if not re.fullmatch(r"GPU\d+", cell)), len(header))
    nv_links = [cell for cell in gpu0[2 : 1 + n_gpus] if re.fullmatch(r"NV\d+", cell)]
    if not nv_links:
        return ScaleUpDomain(gpus=1, link="PCIe")
    return ScaleUpDomain(gpus=len(nv_links) + 1, link=max(set(nv_links), key=nv_links.count))


def gpu_generation(name: str, compute_cap: str | None) -> str:
    arch = next((gen for pattern, gen in _GPU_GENERATIONS if re.search(pattern, name)), "unknown architecture")
    sm = f", sm_{compute_cap.replace('.', '')}" if compute_cap else ""
    return f"{arch} ({name}{sm})"


def cpu_facts(cpuinfo_text: str) -> dict[str, object]:
    """Model, sockets, physical cores and the widest GEMM-relevant ISA from /proc/cpuinfo."""
    model, sockets, cores, flags = "unknown CPU", set(), set(), set()
    physical = "0"
    for line in cpuinfo_text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name":
            model = value
        elif key == "physical id":
            physical = value
            sockets.add(value)
        elif key == "core id":
            cores.add((physical, value))
        elif key == "flags" and not flags:
            flags = set(value.split())
    isa = next((name for name, flag in (("AMX", "amx_tile"), ("AVX-512", "avx512f"), ("AVX2", "avx2"))
                if flag in flags), "scalar/SSE")
    return {"model": model, "sockets": len(sockets) or None, "cores": len(cores) or None, "isa": isa}


def _accelerators(notes: list[str]) -> tuple[Accelerators, str, str]:
    gpus = _query_gpus()
    if gpus:
        topo_text = _run(["nvidia-smi", "topo", "-m"])
        domain = parse_topology(topo_text) if topo_text else None
        if domain is None:
            notes.append("nvidia-smi topo -m gave no GPU matrix: scale-up domain unknown")
        first = gpus[0]
        infiniband = _infiniband_devices()
        links = ([f"NVLink ({domain.link}, {domain.gpus} GPUs per domain)"] if domain and domain.link != "PCIe"
                 else ["PCIe"])
        links += [f"InfiniBand ({', '.join(infiniband)})"] if infiniband else []
        acc = Accelerators(
            kind="gpu", model=first["name"], count=len(gpus), memory_gib=first["memory_gib"],
            driver_version=first["driver"], compute_capability=first["compute_cap"], scale_up_domain=domain,
            cpu_logical=os.cpu_count() or 1,
        )
        return acc, gpu_generation(first["name"], first["compute_cap"]), " + ".join(links)
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    facts = cpu_facts(cpuinfo)
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    acc = Accelerators(
        kind="cpu", model=str(facts["model"]), count=usable, cpu_sockets=facts["sockets"],
        cpu_physical_cores=facts["cores"], cpu_logical=os.cpu_count() or usable,
    )
    infiniband = _infiniband_devices()
    interconnect = SINGLE_HOST_INTERCONNECT + (f"; InfiniBand visible ({', '.join(infiniband)})" if infiniband else "")
    return acc, f"{platform.machine()} CPU ({facts['model']}, {facts['isa']})", interconnect


def _infiniband_devices() -> list[str]:
    ib = Path("/sys/class/infiniband")
    return sorted(p.name for p in ib.iterdir()) if ib.is_dir() else []


def _software() -> Software:
    import torch
    import torch.distributed as dist

    nccl = None
    if torch.cuda.is_available():
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    return Software(
        python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda, nccl=nccl,
        gloo=dist.is_available() and dist.is_gloo_available(),
        distributed_backend="nccl" if nccl else "gloo",
    )


def _framework(inp: EnvInput) -> Framework:
    if inp.framework and not inp.framework_version:  # an adapter's framework: its installed version
        from trainops.tools.frameworks.base import get_adapter

        adapter = get_adapter(inp.framework)
        return Framework(name=adapter.display_name, version=adapter.version())
    if inp.framework:
        return Framework(name=inp.framework, version=str(inp.framework_version))
    from importlib.metadata import PackageNotFoundError, version

    try:
        return Framework(name=EMBEDDED_FRAMEWORK, version=version("trainops"))
    except PackageNotFoundError:
        raise ToolError("declare_environment",
                        "the trainops package is not installed: run `make test` (pip install -e .)") from None


def _filesystem(path: Path) -> str:
    best, kind = "", "unknown"
    for line in Path("/proc/mounts").read_text().splitlines() if Path("/proc/mounts").exists() else []:
        parts = line.split()
        if len(parts) >= 3 and path.is_relative_to(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind


def measure_checkpoint_write(folder: Path, size_mib: int) -> CheckpointStorage:
    """Write `size_mib` MiB where checkpoints go and fsync it: what a synchronous save costs per MiB.
    The file lives in a temporary folder inside `folder` that is removed afterwards, so the
    declaration (a read tool) leaves nothing behind."""
    try:
        scratch = Path(tempfile.mkdtemp(prefix=".trainops-write-test-", dir=folder))
    except OSError as exc:
        raise ToolError("declare_environment",
                        f"cannot write the checkpoint test file in {folder}: {exc}; pass a writable ckpt_dir") from None
    try:
        chunk = os.urandom(1 << 20)
        started = time.perf_counter()
        with open(scratch / "test.bin", "wb") as fh:
            for _ in range(size_mib):
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        write_s = time.perf_counter() - started
    except OSError as exc:
        raise ToolError("declare_environment",
                        f"cannot write the checkpoint test file in {folder}: {exc}; pass a writable ckpt_dir") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return CheckpointStorage(
        path=str(folder), filesystem=_filesystem(folder), test_size_mib=size_mib,
        write_s=write_s, write_bandwidth_mib_s=size_mib / write_s,
    )


def _checkpoint_folder(ckpt_dir: str | None) -> Path:
    from trainops.workspace import confine, runs_dir

    if ckpt_dir is None:
        return runs_dir()
    try:
        folder = confine(ckpt_dir, "ckpt_dir", must_exist=True)
    except ValueError as exc:
        raise ToolError("declare_environment", str(exc)) from None
    if not folder.is_dir():
        raise ToolError("declare_environment",
                        f"ckpt_dir={ckpt_dir!r} is not a folder; pass the folder checkpoints are written to")
    return folder


def _compute_peak(acc: Accelerators, inp: EnvInput, notes: list[str]) -> ComputePeak:
    """The trainer's own MFU denominator, so the declaration and the metrics agree."""
    import torch

    from trainops.trainer.metrics import GPU_PEAK_TFLOPS_BF16, device_peak_tflops

    if acc.kind == "gpu":
        key = next((k for k in GPU_PEAK_TFLOPS_BF16 if k in acc.model), None)
        if key is not None:
            return ComputePeak(peak_tflops=GPU_PEAK_TFLOPS_BF16[key], dtype="bf16",
                               source=f"vendor-table:{key} (trainops.trainer.metrics)")
        notes.append(f"no vendor peak for {acc.model} in trainops.trainer.metrics.GPU_PEAK_TFLOPS_BF16")
        return ComputePeak(peak_tflops=0.0, dtype="bf16", source="unknown GPU: no vendor peak")
    if not inp.measure_gemm:
        notes.append("CPU GEMM peak not measured (measure_gemm=false)")
        return ComputePeak(peak_tflops=0.0, dtype="fp32", source="not measured")
    peak_tflops, label = device_peak_tflops(torch.device("cpu"), "fp32")
    return ComputePeak(
        peak_tflops=peak_tflops, dtype="fp32",
        source=f"{label} (trainops.trainer.metrics.device_peak_tflops: best of 8 512x512 fp32 GEMMs, "
               f"{torch.get_num_threads()} threads, "
        "cached per CPU in $TRAINOPS_HOME/cache; the same denominator the trainer's MFU uses)",
    )


def _scheduler(kind: SchedulerKind) -> SchedulerDeclaration:
    """Version and partitions per backend; nodes and the idle pool through the scheduler protocol
    (trainops.tools.schedulers), the same view the job tools have."""
    if kind == "kubernetes":
        return _kubernetes()
    from trainops.tools.schedulers.base import SchedulerError, get_scheduler

    try:
        if kind == "slurm":
            from trainops.tools.schedulers.slurm_transport import run_cli, transport_choice

            version = run_cli(["sinfo", "-V"]).stdout.strip()
            partitions = sorted(set(run_cli(["sinfo", "-h", "-o", "%R"]).stdout.split()))
            transport = "{} ({})".format(*transport_choice())
        else:
            import torch

            version, partitions = f"trainops local (torchrun, torch {torch.__version__})", ["local"]
            transport = "local processes"
        nodes = get_scheduler(kind).list_nodes()
    except SchedulerError as exc:
        raise ToolError("declare_environment", str(exc)) from None
    return SchedulerDeclaration(kind=kind, version=version, partitions=partitions, nodes=[n.name for n in nodes],
                     hot_spare_nodes=[n.name for n in nodes if n.state == "idle"],
                     cpus_per_node={n.name: n.cpus for n in nodes if n.cpus}, transport=transport)


def _kubernetes() -> SchedulerDeclaration:
    try:
        from kubernetes import client, config

        config.load_kube_config()
        version = client.VersionApi().get_code().git_version
        node_list = client.CoreV1Api().list_node().items
        busy = {p.spec.node_name
                for p in client.CoreV1Api().list_pod_for_all_namespaces(field_selector="status.phase=Running").items
                if p.metadata.namespace != "kube-system"}
    except Exception as exc:  # config, connection and API errors all mean: no usable cluster
        raise ToolError("declare_environment",
                        f"kubernetes: no reachable cluster ({exc.__class__.__name__}: {exc}); set KUBECONFIG or use "
                        "scheduler=local") from None
    names = [n.metadata.name for n in node_list]
    ready = [n.metadata.name for n in node_list if not n.spec.unschedulable and any(
        c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])]
    pools = sorted({(n.metadata.labels or {}).get("cloud.google.com/gke-nodepool", "default") for n in node_list})
    return SchedulerDeclaration(kind="kubernetes", version=version, partitions=pools, nodes=names,
                     hot_spare_nodes=[n for n in ready if n not in busy])


@tool("declare_environment", risk="read", tags=("environment", "S1"))
def declare_environment(inp: EnvInput) -> EnvironmentDeclaration:
    """Declare the training environment (SOP step S1): accelerators and their scale-up domain,
    hardware generation, interconnect, torch/CUDA/NCCL/gloo versions, framework and version,
    scheduler version, partitions and hot-spare pool, measured checkpoint write bandwidth and
    measured compute peak. Required before any MFU or scaling conclusion."""
    folder = _checkpoint_folder(inp.ckpt_dir)
    notes: list[str] = []
    host = socket.gethostname()
    acc, generation, interconnect = _accelerators(notes)
    scheduler = _scheduler(inp.scheduler)
    measured = declare_interconnect(inp.scheduler, len(scheduler.nodes)) if inp.measure_interconnect else None
    if measured:
        interconnect = (f"between nodes {', '.join(measured.nodes)}: all-reduce {measured.latency_us:.0f} us, "
                        f"{measured.bandwidth_gbit_s:.2f} Gbit/s (measured, {measured.backend}); within a node: "
                        f"{interconnect}")
    return EnvironmentDeclaration(
        declared_at=datetime.now(timezone.utc),
        host=host,
        accelerators=acc,
        hardware_generation=generation,
        interconnect=interconnect,
        software=_software(),
        framework=_framework(inp),
        scheduler=scheduler,
        checkpoint_storage=measure_checkpoint_write(folder, inp.ckpt_test_mib),
        compute_peak=_compute_peak(acc, inp, notes),
        inter_node_all_reduce=measured,
        notes=notes,
    )
