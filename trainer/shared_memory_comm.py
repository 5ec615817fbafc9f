"""Data-parallel collectives through shared memory, for ranks that share one CPU host.

gloo moves tensors between processes over TCP even on one host: at the issue-17 shape (12 MB of
fp32 gradients, 2 ranks) its reduce-scatter takes 14 ms and its all-gather 7 ms, where reading the
peer's copy out of shared memory takes 3 ms each. FSDP2's custom-collective hooks
(`set_custom_reduce_scatter` / `set_custom_all_gather`) and DDP's comm hook route the gradients and
parameters through one shared buffer per rank; gloo only orders the ranks, one barrier per
collective. Every rank sums the copies in rank order, so results do not depend on timing.

The buffers live in /dev/shm, each created by its rank with O_EXCL and mode 0600 under a name
drawn at random by the group's first rank, and unlinked as soon as every rank has mapped them
(milliseconds later): a killed job leaves nothing behind. Equal host names only pre-select the
group; mapping every peer's buffer is the proof that the ranks share memory (containers with one
name on two machines, or private /dev/shm mounts, fail it and keep gloo).
"""

import os
import secrets
import socket
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

SHM_DIR = Path("/dev/shm")
_PAGE = 4096


class SharedMemoryUnavailable(RuntimeError):
    """The group's ranks could not all make and map their buffers (raised on every rank alike)."""


class SharedBuffers:
    """One shared-memory buffer per rank of `group`, in two halves used alternately. A rank writes
    a half again only after the barrier of the next collective, which every rank reaches only once
    it has read that half: so one barrier per collective keeps each reader ahead of the writer."""

    def __init__(self, group: dist.ProcessGroup, strict: bool, shm_dir: Path = SHM_DIR):
        self.group, self.strict, self.shm_dir = group, strict, shm_dir
        self.failed: str | None = None
        self.rank, self.world = group.rank(), group.size()
        token = [secrets.token_hex(8) if self.rank == 0 else None]
        dist.broadcast_object_list(token, group=group, group_src=0)
        self.token = token[0]
        self.half_bytes, self.generation, self.calls = 0, 0, 0
        self.buffers: list[torch.Tensor] = []

    def serves(self, group: dist.ProcessGroup) -> bool:
        return group is self.group and self.failed is None

    def exchange(self, tensor: torch.Tensor) -> list[torch.Tensor] | None:
        """Publish `tensor` and return every rank's published copy (views into shared memory, flat,
        in rank order; valid until this rank's next exchange). Collective over the group. None,
        on every rank alike, when the buffers could not grow to hold it and gloo is to take over
        (parallel.cpu_collectives=auto; `shared_memory` raises instead)."""
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes > self.half_bytes:
            try:
                self._grow(nbytes)
            except SharedMemoryUnavailable as error:
                if self.strict:
                    raise ValueError(f"parallel.cpu_collectives=shared_memory: {error}; free space in "
                                     f"{self.shm_dir} (docker: --shm-size) or set parallel.cpu_collectives=auto"
                                     ) from None
                self.failed = str(error)
                print(f"shared-memory collectives unavailable ({error}); gloo takes over", flush=True)
                return None
        start = (self.calls % 2) * self.half_bytes
        self.calls += 1

        def copy_of(rank: int) -> torch.Tensor:
            return self.buffers[rank][start:start + nbytes].view(tensor.dtype)

        copy_of(self.rank).copy_(tensor.reshape(-1))
        dist.barrier(group=self.group)
        return [copy_of(rank) for rank in range(self.world)]

    def _path(self, rank: int) -> Path:
        return self.shm_dir / f"trainops-{self.token}-{self.generation}-rank{rank}"

    def _grow(self, nbytes: int) -> None:
        """Replace every rank's buffer by one whose halves hold `nbytes` (collective). The pages
        are reserved up front: a /dev/shm too small to hold them fails here on every rank, not as
        a SIGBUS on first touch."""
        half = -(-max(nbytes, self.half_bytes * 2) // _PAGE) * _PAGE
        self.generation += 1
        mine = self._path(self.rank)
        buffers: list[torch.Tensor] = []
        try:
            self._agree(_try(lambda: _reserve(mine, 2 * half)), f"reserving {2 * half / 2**20:.0f} MiB in "
                        f"{self.shm_dir}")
            self._agree(_try(lambda: buffers.extend(
                torch.from_file(str(self._path(rank)), shared=True, size=2 * half, dtype=torch.uint8)
                for rank in range(self.world))), "mapping the peers' buffers")
        finally:
            mine.unlink(missing_ok=True)
        self.buffers, self.half_bytes = buffers, half

    def _agree(self, problem: str | None, what: str) -> None:
        """All ranks learn whether any failed, so all raise together instead of one waiting forever."""
        failed = torch.tensor([0 if problem is None else 1], dtype=torch.int32)
        dist.all_reduce(failed, group=self.group)
        if failed.item():
            raise SharedMemoryUnavailable(f"{what} failed on {failed.item()} of {self.world} ranks"
                                          + (f" (here: {problem})" if problem else ""))


def _reserve(path: Path, nbytes: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    finally:
        os.close(fd)


def _try(action) -> str | None:
    try:
        action()
    except (OSError, RuntimeError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def _sum_in_rank_order(copies: list[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    torch.add(copies[0], copies[1], out=out)
    for copy in copies[2:]:
        out.add_(copy)
    return out


class _ThroughBuffers:
    """What FSDP2's custom collectives share: the buffers, and plain memory for FSDP's own tensors
    (its reduce-scatter output becomes the sharded gradients, so it must not live in a buffer)."""

    def __init__(self, buffers: SharedBuffers):
        self.buffers = buffers

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class SharedMemoryReduceScatter(_ThroughBuffers, ReduceScatter):
    """FSDP2's gradient reduce-scatter, through `buffers` (sum or average; other ops go to gloo)."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op=dist.ReduceOp.SUM, async_op: bool = False):
        copies = self.buffers.exchange(input_tensor) if self.buffers.serves(group) and op in (
            dist.ReduceOp.SUM, dist.ReduceOp.AVG) else None
        if copies is None:
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        shard, rank = output_tensor.numel(), self.buffers.rank
        _sum_in_rank_order([copy[rank * shard:(rank + 1) * shard] for copy in copies], output_tensor.view(-1))
        if op == dist.ReduceOp.AVG:
            output_tensor.div_(self.buffers.world)
        return None


class SharedMemoryAllGather(_ThroughBuffers, AllGather):
    """FSDP2's parameter all-gather, through `buffers`."""

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False):
        copies = self.buffers.exchange(input_tensor) if self.buffers.serves(group) else None
        if copies is None:
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        shard, out = input_tensor.numel(), output_tensor.view(-1)
        for rank, copy in enumerate(copies):
            piece = out[rank * shard:(rank + 1) * shard]
            if piece.data_ptr() != input_tensor.data_ptr():  # FSDP gathers in place: its own shard is there
                piece.copy_(copy)
        return None


def ddp_allreduce_hook(buffers: SharedBuffers, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's gradient average for one bucket, through `buffers` (register with
    `DistributedDataParallel.register_comm_hook(buffers, ddp_allreduce_hook)`)."""
    flat = bucket.buffer()
    copies = buffers.exchange(flat) if buffers.failed is None else None
    if copies is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        return allreduce_hook(buffers.group, bucket)
    _sum_in_rank_order(copies, flat).div_(buffers.world)
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(flat)
    return done


def shared_buffers_for(group: dist.ProcessGroup, mode: str, device_type: str,
                       shm_dir: Path = SHM_DIR) -> SharedBuffers | None:
    """The shared buffers for the data-parallel `group` under `parallel.cpu_collectives` (collective
    over the group), or None where gloo keeps the collectives: "gloo", an accelerator, a group that
    spans hosts (auto), or a /dev/shm that cannot hold the first buffers (auto)."""
    if mode == "gloo" or group.size() < 2:
        return None
    if device_type != "cpu":
        if mode == "shared_memory":
            raise ValueError(f"parallel.cpu_collectives=shared_memory is for CPU runs; this one is on "
                             f"{device_type}: set parallel.cpu_collectives=auto")
        return None
    hosts: list[str | None] = [None] * group.size()
    dist.all_gather_object(hosts, socket.gethostname(), group=group)
    if len(set(hosts)) > 1:
        if mode == "shared_memory":
            raise ValueError(f"parallel.cpu_collectives=shared_memory needs every data-parallel rank on one "
                             f"host; this group spans {sorted(set(hosts))}: set parallel.cpu_collectives=auto")
        return None
    buffers = SharedBuffers(group, strict=mode == "shared_memory", shm_dir=shm_dir)
    return buffers if buffers.exchange(torch.zeros(1)) is not None else None  # the first buffers, made now
