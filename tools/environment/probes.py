"""The probes behind `declare_environment`, and the tool itself: each probe reads one fact from
this machine (nvidia-smi, /proc/cpuinfo, /proc/mounts, torch, the scheduler) or measures it
(checkpoint write bandwidth, the CPU GEMM peak), and returns the model of tools/environment/env.py that
declares it; `declare_environment` runs them in turn. The models know nothing of the probes.

The parsers (`parse_gpu_query`, `parse_topology`, `cpu_facts`) take the command's text, so the
tests feed them other machines' output.
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
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from trainops.tools.base import ToolError, tool
from trainops.tools.changes import known_issues
from trainops.tools.changes.scheduler_policy import configured_shadow_partition
from trainops.tools.environment.env import (
    SINGLE_HOST_INTERCONNECT,
    Accelerators,
    CheckpointStorage,
    ComputePeak,
    EnvInput,
    EnvironmentDeclaration,
    Framework,
    ScaleUpDomain,
    SchedulerDeclaration,
    Software,
)
from trainops.tools.environment.interconnect import declare_interconnect
from trainops.tools.frameworks import get_adapter
from trainops.tools.schedulers import get_scheduler
from trainops.tools.schedulers.base import SchedulerError, SchedulerKind
from trainops.tools.schedulers.slurm_transport import run_cli, transport_choice
from trainops.workspace import confine, runs_dir

# GPU product names -> architecture generation (the MFU denominator depends on it).
_GPU_GENERATIONS = (
    (r"GB200|B200|B100|GB300|B300", "Blackwell"),
    (r"H100|H200|H800|H20|GH200", "Hopper"),
    (r"L40|L4\b|RTX 40|RTX 6000 Ada", "Ada Lovelace"),
    (r"A100|A800|A10\b|A30|A40|RTX 30", "Ampere"),
    (r"V100", "Volta"),
    (r"MI300|MI325", "CDNA 3"),
)


def _command_output(cmd: list[str], timeout_s: float = 15) -> str | None:
    """stdout of a command, or None when it is missing or fails (absence is a fact, not an error)."""
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
        text = _command_output(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"])
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


def read_accelerators(notes: list[str]) -> tuple[Accelerators, str, str]:
    gpus = _query_gpus()
    if gpus:
        topo_text = _command_output(["nvidia-smi", "topo", "-m"])
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


def read_software() -> Software:
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


def declared_framework(inp: EnvInput) -> Framework:
    """The framework named (an adapter's: its display name and installed version), else the embedded
    trainer as its adapter names it, at the installed trainops version."""
    if inp.framework and not inp.framework_version:  # an adapter's framework: its installed version
        adapter = get_adapter(inp.framework)
        return Framework(name=adapter.display_name, version=adapter.version())
    if inp.framework:
        return Framework(name=inp.framework, version=str(inp.framework_version))

    try:
        return Framework(name=get_adapter("trainops").display_name, version=version("trainops"))
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


def checkpoint_folder(ckpt_dir: str | None) -> Path:
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


def compute_peak(acc: Accelerators, inp: EnvInput, notes: list[str]) -> ComputePeak:
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


def read_scheduler(kind: SchedulerKind) -> SchedulerDeclaration:
    """Version and partitions per backend; nodes and the idle pool through the scheduler protocol
    (trainops.tools.schedulers), the same view the job tools have."""
    if kind == "kubernetes":
        return _read_kubernetes()

    try:
        if kind == "slurm":
            version = run_cli(["sinfo", "-V"]).stdout.strip()
            listed = run_cli(["sinfo", "-h", "-o", "%P"]).stdout.split()  # the default partition ends in '*'
            partitions = sorted({p.rstrip("*") for p in listed})
            default = next((p.rstrip("*") for p in listed if p.endswith("*")), None)
            transport = "{} ({})".format(*transport_choice())
        else:
            import torch

            version, partitions, default = f"trainops local (torchrun, torch {torch.__version__})", ["local"], None
            transport = "local processes"
        nodes = get_scheduler(kind).list_nodes()
    except SchedulerError as exc:
        raise ToolError("declare_environment", str(exc)) from None
    configured = configured_shadow_partition("declare_environment") if kind == "slurm" else None
    shadow = configured if configured in partitions else None
    shadow_only = {n.name for n in nodes if shadow is not None and n.partitions and set(n.partitions) == {shadow}}
    training = [n for n in nodes if n.name not in shadow_only]  # shadow-only nodes are never a training job's spare
    # the local scheduler's one node is the host every job runs on: idle or not, nothing can replace it
    spares = [] if kind == "local" else [n.name for n in training if n.state == "idle"]
    return SchedulerDeclaration(kind=kind, version=version, partitions=partitions, default_partition=default,
                                partition_nodes={p: [n.name for n in nodes if p in n.partitions] for p in partitions
                                                 if kind == "slurm"},
                                shadow_partition=shadow, nodes=[n.name for n in training], hot_spare_nodes=spares,
                                shadow_nodes=[n.name for n in nodes if n.name in shadow_only],
                                cpus_per_node={n.name: n.cpus for n in training if n.cpus}, transport=transport)


def partition_of(scheduler: SchedulerDeclaration, partition: str | None) -> str | None:
    """The partition a job asking for `partition` runs in: refused, naming `sinfo`, where the cluster has none
    of that name; None for a scheduler without partitions."""
    if partition is not None and partition not in scheduler.partitions:
        raise ToolError("declare_environment", f"partition={partition!r} does not exist on this cluster: `sinfo` "
                                               f"lists {', '.join(scheduler.partitions) or 'no partition'}; name one "
                                               "of those, or omit partition for the default "
                                               f"({scheduler.default_partition or 'none'})")
    return partition or scheduler.default_partition


def _read_kubernetes() -> SchedulerDeclaration:
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
    folder = checkpoint_folder(inp.ckpt_dir)
    notes: list[str] = []
    host = socket.gethostname()
    acc, generation, interconnect = read_accelerators(notes)
    scheduler = read_scheduler(inp.scheduler)
    partition = partition_of(scheduler, inp.partition)
    pool = scheduler.partition_nodes.get(partition, scheduler.nodes) if partition else scheduler.nodes
    measured = declare_interconnect(inp.scheduler, len(pool), inp.partition) if inp.measure_interconnect else None
    if measured:
        interconnect = (f"between nodes {', '.join(measured.nodes)}: all-reduce {measured.latency_us:.0f} us, "
                        f"{measured.bandwidth_gbit_s:.2f} Gbit/s (measured, {measured.backend}); within a node: "
                        f"{interconnect}")
    software, framework = read_software(), declared_framework(inp)
    versions = known_issues.declared_versions(framework.name, framework.version, software.torch,
                                                   f"{scheduler.kind} {scheduler.version}")
    return EnvironmentDeclaration(
        declared_at=datetime.now(timezone.utc),
        host=host,
        accelerators=acc,
        hardware_generation=generation,
        interconnect=interconnect,
        software=software,
        framework=framework,
        scheduler=scheduler,
        checkpoint_storage=measure_checkpoint_write(folder, inp.ckpt_test_mib),
        compute_peak=compute_peak(acc, inp, notes),
        inter_node_all_reduce=measured,
        known_issues=known_issues.known_issues(versions),
        notes=notes,
    )
