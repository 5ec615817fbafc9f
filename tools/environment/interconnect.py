"""Measured inter-node all-reduce for the environment declaration (S1): a 2-node job submitted
through the scheduler runs gloo all-reduces across the nodes' own network (the path a training
job's collectives take), a small message for latency and a large one for bandwidth, and rank 0
writes the figures. Run as a module it is that job's program:
`python -m trainops.tools.environment.interconnect RESULT.json` under torchrun."""
from __future__ import annotations

import json
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from trainops.tools.base import ToolError
from trainops.tools.schedulers import get_scheduler
from trainops.tools.schedulers.base import JobSpec, SchedulerError
from trainops.workspace import home

LATENCY_BYTES = 4  # one float32
BANDWIDTH_BYTES = 16 * 2**20
LATENCY_ITERS, BANDWIDTH_ITERS = 50, 5


class InterconnectMeasurement(BaseModel):
    nodes: list[str] = Field(description="The nodes the all-reduce job ran on.")
    backend: str = Field(description="Collective backend of the measurement (gloo on CPUs).")
    latency_us: float = Field(description=f"Median time of a {LATENCY_BYTES}-byte all-reduce, microseconds "
                                          f"({LATENCY_ITERS} runs; measured).")
    bandwidth_gbit_s: float = Field(description=f"Bus bandwidth of a {BANDWIDTH_BYTES // 2**20} MiB all-reduce: "
                                                "2(n-1)/n x size / median time, Gbit/s (nccl-tests' convention; "
                                                "measured).")
    message_mib: float = Field(description="Size of the bandwidth message, MiB.")
    job_id: str = Field(description="The scheduler job the figures come from.")
    seconds: float = Field(description="Wall time of the whole measurement, submit to result.")


def _median_s(run, iters: int) -> float:
    run()  # the first all-reduce pays for connection set-up
    samples = []
    for _ in range(iters):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def _worker(result_path: str) -> None:
    """One rank of the measurement job (rank 0 writes the result)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    small = torch.ones(LATENCY_BYTES // 4)
    large = torch.ones(BANDWIDTH_BYTES // 4)
    latency_s = _median_s(lambda: dist.all_reduce(small), LATENCY_ITERS)
    bandwidth_s = _median_s(lambda: dist.all_reduce(large), BANDWIDTH_ITERS)
    world = dist.get_world_size()
    hosts: list[str] = [""] * world
    dist.all_gather_object(hosts, socket.gethostname())
    if dist.get_rank() == 0:
        bus_bytes = 2 * (world - 1) / world * BANDWIDTH_BYTES
        Path(result_path).write_text(json.dumps({
            "nodes": hosts, "backend": "gloo", "latency_us": latency_s * 1e6,
            "bandwidth_gbit_s": bus_bytes * 8 / bandwidth_s / 1e9, "message_mib": BANDWIDTH_BYTES / 2**20}))
    dist.destroy_process_group()


def measure_all_reduce(scheduler_kind: str, nodes: int = 2, timeout_s: float = 120.0,
                       partition: str | None = None) -> InterconnectMeasurement:
    """Submit the measurement job on `nodes` nodes (of `partition`; None: the default), wait for it, and
    read its figures. Raises
    ValueError naming what went wrong (the caller turns it into its own tool error)."""
    scheduler = get_scheduler(scheduler_kind)
    folder = Path(tempfile.mkdtemp(prefix="interconnect-", dir=home()))  # a shared run folder, as for training
    result = folder / "result.json"
    started = time.monotonic()
    try:
        handle = scheduler.submit(JobSpec(name="trainops-allreduce-probe", launcher="torchrun", nodes=nodes,
                                          procs_per_node=1,
                                          command=["-m", "trainops.tools.environment.interconnect", str(result)],
                                          workdir=str(folder), time_limit_min=5, partition=partition))
        status = scheduler.wait(handle.job_id, timeout_s)
        if not result.exists():
            log = scheduler.logs(handle.job_id, tail=20)
            raise ValueError(f"the all-reduce job {handle.job_id} ended {status.state} without a result "
                             f"({status.reason}); its log ends:\n{log}")
        figures = json.loads(result.read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return InterconnectMeasurement(**figures, job_id=handle.job_id, seconds=round(time.monotonic() - started, 3))


def declare_interconnect(scheduler_kind: str, node_count: int, partition: str | None = None) -> InterconnectMeasurement:
    """The measurement as declare_environment reports it: a tool error naming the field on failure."""
    if node_count < 2:
        where = f"partition {partition!r}" if partition else "the scheduler"
        raise ToolError("declare_environment", f"measure_interconnect: {where} has {node_count} node(s) and "
                                               "the measurement needs 2; set it false or use a multi-node cluster")
    try:
        return measure_all_reduce(scheduler_kind, partition=partition)
    except (SchedulerError, ValueError) as exc:
        raise ToolError("declare_environment", f"measure_interconnect: {exc}") from None


if __name__ == "__main__":
    _worker(sys.argv[1])
