"""Per-step numbers a team can trust: FLOPs per token with the convention stated, MFU against
a labelled peak, memory, JSONL + Prometheus + a readable line, and a heartbeat per rank."""
from __future__ import annotations

import fcntl
import json
import os
import platform
import resource
import socket
import time
from pathlib import Path
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from trainops.run_folder import RunFiles
from trainops.run_records import Heartbeat, RankExit, read_heartbeat
from trainops.trainer.config import MetricsConfig
from trainops.trainer.model_args import ModelArgs, count_parameters

# Dense bf16 tensor-core peaks in TFLOP/s (vendor data sheets, no sparsity). Matched by
# substring of torch.cuda.get_device_name(); the first match wins, so specific names go first.
GPU_PEAK_TFLOPS_BF16: dict[str, float] = {
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.0,   # SXM
    "H200": 989.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "B100": 1750.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10G": 70.0,
    "MI300X": 1307.0,
    "MI250X": 383.0,
}

RECORD_FIELDS = ("step", "rank", "loss", "grad_norm", "step_time_s", "tokens_per_s", "flops_per_token",
                 "tflops", "mfu_pct", "peak_mem_gib", "time", "data_wait_s")


def flops_per_token(args: ModelArgs, seq_len: int) -> int:
    """Training FLOPs per token, torchtitan's convention (after PaLM, appendix B):
    `6 * (N - N_embedding) + 12 * layers * heads * head_dim * seq_len`.

    6 = 2 FLOPs per multiply-add x 3 (forward, and backward for inputs and weights). The first
    term covers every matmul weight (the output projection counts even when tied, the embedding
    lookup does not); the second is attention's two matmuls (QK^T and AV, 2*2*h*hd*seq forward,
    x3). The causal mask is not halved and activation recomputation is not counted: MFU measures
    useful work. (The `6*layers*...` form quoted in some notes is the causal-halved count.)
    """
    counts = count_parameters(args)
    matmul_params = counts["total"] - counts["embedding"] + (
        args.vocab_size * args.dim if args.tie_embeddings else 0)
    return 6 * matmul_params + 12 * args.n_layers * args.n_heads * args.head_dim * seq_len


def _peak_cache_path() -> Path:
    return Path(os.environ.get("TRAINOPS_HOME", ".trainops")).expanduser() / "cache" / "peak_flops.json"


PEAK_SAMPLE_GAP_S = 0.01
"""The sleep before each timed CPU GEMM of the peak measurement (16 of them: 0.16 s, once per cache key)."""


def measure_gemm_peak_tflops(dtype: torch.dtype, device: torch.device | str = "cpu",
                             size: int | None = None, repeats: int = 16) -> float:
    """Best-of-N square GEMM throughput of this process on `device`, in TFLOP/s: the peak used
    for CPUs (with this process's thread count) and for GPUs missing from the vendor table. Each
    timed GEMM follows a short sleep, so on a CPU shared with other processes it starts on a fresh
    time slice: back-to-back GEMMs under load were each preempted, the peak came out at 60% of the
    core's and the runs measured against it at 167% MFU."""
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 512)
    a = torch.randn(size, size, dtype=dtype, device=device)
    b = torch.randn(size, size, dtype=dtype, device=device)
    torch.mm(a, b)  # warm-up
    best_s = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        else:
            time.sleep(PEAK_SAMPLE_GAP_S)
        started = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best_s = min(best_s, time.perf_counter() - started)
    return 2 * size**3 / best_s / 1e12


def device_peak_tflops(device: torch.device, precision: str) -> tuple[float | None, str]:
    """(peak TFLOP/s, label): `vendor-table:<name>` for known GPUs; for a GPU missing from the table
    no peak (None, `missing-from-table:<device>`): a stand-in peak is how MFUs above 100% get shipped;
    for CPUs `measured-gemm` (cached per device model, dtype and thread count in $TRAINOPS_HOME/cache)."""
    model_name = platform.processor() or platform.machine()
    if device.type == "cuda":
        model_name = torch.cuda.get_device_name(device)
        for key, peak in GPU_PEAK_TFLOPS_BF16.items():
            if key in model_name:
                return peak, f"vendor-table:{key}"
        return None, f"missing-from-table:{model_name} (not in trainer/metrics.py GPU_PEAK_TFLOPS_BF16)"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    key = f"{device.type}|{model_name}|{dtype}|{torch.get_num_threads()}"
    cache = _peak_cache_path()
    try:
        cached = json.loads(cache.read_text())
    except (OSError, ValueError):
        cached = {}
    if key not in cached:
        cached[key] = measure_gemm_peak_tflops(dtype, device)
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(cached, indent=1))
        partial.replace(cache)
    return cached[key], "measured-gemm"


def peak_memory_gib(device: torch.device) -> float:
    """GPU: the allocator's peak (tensors only). CPU: the process's peak resident set, which
    includes the interpreter and torch itself (about 0.3 GiB before any tensor)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class MetricsLogger:
    """Writes one record per step: metrics.jsonl, the Prometheus gauges, the heartbeat file,
    and (rank 0, every `log_every` steps) one readable line."""
    def __init__(self, cfg: MetricsConfig, run_dir: Path, rank: int, *, run_id: str, total_steps: int,
                 peak_tflops: float | None, peak_source: str):
        self.cfg, self.run_dir, self.rank = cfg, Path(run_dir), rank
        self.run_id, self.total_steps = run_id, total_steps
        self.peak_tflops, self.peak_source = peak_tflops, peak_source
        self.heartbeat_path = RunFiles(self.run_dir).heartbeat(rank)
        self.metrics_path = RunFiles(self.run_dir).metrics
        self.heartbeat_path.parent.mkdir(parents=True, exist_ok=True)
        self.gauges: dict[str, Any] = {}
        if cfg.prometheus_port_base:
            self._start_exporter(cfg.prometheus_port_base + rank)

    def _start_exporter(self, port: int) -> None:
        registry = CollectorRegistry()
        for name in RECORD_FIELDS:
            if name not in ("rank", "step"):
                self.gauges[name] = Gauge(f"trainops_{name}", f"trainer {name} of the latest step",
                                          ["run", "rank"], registry=registry)
        self.gauges["step"] = Gauge("trainops_step", "latest completed step (heartbeat)",
                                    ["run", "rank"], registry=registry)
        start_http_server(port, addr="0.0.0.0", registry=registry)
        self._register_exporter(f"{socket.gethostname()}:{port}")

    def _register_exporter(self, address: str) -> None:
        """Ranks start at once: a file lock keeps their read-modify-write of exporters.json whole."""
        path = RunFiles(self.run_dir).exporters
        with open(self.run_dir / ".exporters.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            exporters = json.loads(path.read_text()) if path.exists() else {}
            exporters[str(self.rank)] = address
            path.write_text(json.dumps(exporters, indent=1, sort_keys=True))

    def heartbeat(self, step: int) -> None:
        if not self.cfg.heartbeat:
            return
        partial = self.heartbeat_path.with_suffix(".tmp")
        partial.write_text(Heartbeat(step=step, time=time.time(), pid=os.getpid(),
                                     host=socket.gethostname()).model_dump_json(exclude_none=True))
        partial.replace(self.heartbeat_path)

    def record(self, *, step: int, loss: float, grad_norm: float, step_time_s: float, tokens: int,
               flops_per_token: int, peak_mem_gib: float, data_wait_s: float,
               extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """`tokens` are this device's share of the step's tokens; `extra` fields (such as the
        replica checksum) go to metrics.jsonl only."""
        tokens_per_s = tokens / step_time_s
        tflops = tokens_per_s * flops_per_token / 1e12
        record = {
            "step": step, "rank": self.rank, "loss": loss, "grad_norm": grad_norm,
            "step_time_s": step_time_s, "tokens_per_s": tokens_per_s, "flops_per_token": flops_per_token,
            "tflops": tflops, "mfu_pct": 100.0 * tflops / self.peak_tflops if self.peak_tflops else None,
            "peak_mem_gib": peak_mem_gib, "time": time.time(), "data_wait_s": data_wait_s,
            "peak_source": self.peak_source, **(extra or {}),
        }
        if self.cfg.jsonl:
            line = (json.dumps(record) + "\n").encode()
            fd = os.open(self.metrics_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line)  # one O_APPEND write per line: ranks never interleave
            finally:
                os.close(fd)
        for name, gauge in self.gauges.items():
            if record[name] is not None:  # no MFU without a peak
                gauge.labels(run=self.run_id, rank=str(self.rank)).set(record[name])
        self.heartbeat(step)
        if self.rank == 0 and (step % self.cfg.log_every == 0 or step == self.total_steps):
            print(format_line(record, self.total_steps), flush=True)
        return record


def note_exit(run_dir: str | Path, rank: int, error: str, stopped_by: str | None = None, where: str = "") -> None:
    """Add how this rank ended to its heartbeat. A rank that exits saying why (often a peer's
    failure seen as a broken collective) is collateral; one that vanished without a word was
    killed: detection names the latter as the root cause."""
    beat = read_heartbeat(run_dir, rank) or Heartbeat(step=0, pid=os.getpid(), host=socket.gethostname())
    beat.exit = RankExit(time=time.time(), error=error[:300], stopped_by=stopped_by, where=where[:300])
    path = RunFiles(run_dir).heartbeat(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".exit.tmp")
    partial.write_text(beat.model_dump_json(exclude_none=True))
    partial.replace(path)


def param_checksum(model: torch.nn.Module) -> float:
    """Sum of this rank's parameter values in float64. Replicas that hold the same shard must
    agree bit for bit after every step; a flipped bit on one of them shows as a mismatch."""
    total = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for param in model.parameters():
            total += getattr(param, "_local_tensor", param).double().sum().cpu()  # a DTensor's own shard
    return total.item()


def format_line(record: dict[str, Any], total_steps: int) -> str:
    return (f"step {record['step']:>5}/{total_steps}  loss {record['loss']:.4f}  "
            f"grad_norm {record['grad_norm']:.3f}  step_time {record['step_time_s'] * 1e3:.0f}ms  "
            f"tok/s {record['tokens_per_s']:,.0f}  tflops {record['tflops']:.3f}  "
            f"mfu {'n/a' if record['mfu_pct'] is None else format(record['mfu_pct'], '.2f') + '%'} "
            f"({record['peak_source']})  "
            f"mem {record['peak_mem_gib']:.2f}GiB  data_wait {record['data_wait_s'] * 1e3:.1f}ms")
