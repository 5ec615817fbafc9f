"""Data-parallel collectives through shared memory, for ranks that share one CPU host.

gloo moves tensors between processes over TCP even on one host: at the issue-17 shape (12 MB of
fp32 gradients, 2 ranks) its reduce-scatter takes 14 ms and its all-gather 7 ms, where reading the
peer's copy out of shared memory takes 3 ms each. FSDP2's custom-collective hooks
(`set_custom_reduce_scatter` / `set_custom_all_gather`) and DDP's comm hook route the gradients and
parameters through one shared buffer; gloo only orders the ranks, one barrier per collective.
Every rank sums the copies in rank order, so results do not depend on timing. FSDP writes its
gradients (and, with one FSDP unit, its parameter shards, and gathers them) in the buffer itself,
which saves the copies into and out of it.

The buffer lives in /dev/shm, created by the group's first rank with O_EXCL and mode 0600 under a
name drawn at random, and unlinked as soon as every rank has mapped it (milliseconds later, or
by the trainer's SIGTERM handler: `unlink_unmapped`). Equal host names only pre-select the group:
the other ranks open the file without ever creating one, and every rank must read back the random
nonce each wrote into it. Containers with one name on two machines, or private /dev/shm mounts,
fail that and keep gloo (or are refused by name under parallel.cpu_collectives=shared_memory).
"""

import math
import mmap
import os
import secrets
import socket
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

SHM_DIR = Path("/dev/shm")
_PAGE = 4096
_UNMAPPED: set[Path] = set()  # made here, not yet unlinked: a SIGTERM in that window unlinks them


class SharedMemoryUnavailable(RuntimeError):
    """The group's ranks could not all make and map their buffer (raised on every rank alike)."""
class SharedBuffers:
    """One shared-memory buffer for the ranks of `group`, in two halves used alternately; a half
    holds one region per rank, in rank order, so a gather's regions are its output. A rank writes
    a half again only after the barrier of the next collective, which every rank reaches only once
    it has read that half: so one barrier per collective keeps each reader ahead of the writer."""
    def __init__(self, group: dist.ProcessGroup, strict: bool, shm_dir: Path = SHM_DIR):
        self.group, self.strict, self.shm_dir = group, strict, shm_dir
        self.failed: str | None = None
        self.rank, self.world = group.rank(), group.size()
        token = [secrets.token_hex(8) if self.rank == 0 else None]
        dist.broadcast_object_list(token, group=group, group_src=0)
        self.token = token[0]
        self.region_bytes, self.generation, self.calls = 0, 0, 0
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.unread_gather = False  # a gather's output that lives in the buffer, not yet copied out

    def serves(self, group: dist.ProcessGroup) -> bool:
        return group is self.group and self.failed is None

    def exchange(self, tensor: torch.Tensor) -> list[torch.Tensor] | None:
        """Publish `tensor` and return every rank's published copy (views into shared memory, flat,
        in rank order; valid until this rank's next exchange). Collective over the group. None,
        on every rank alike, when the buffer could not grow to hold it and gloo is to take over
        (parallel.cpu_collectives=auto; `shared_memory` raises instead)."""
        if self.unread_gather:
            raise RuntimeError("a shared-memory all-gather's output was not copied out before the next "
                               "collective (FSDP prefetching ahead?): set parallel.cpu_collectives=gloo")
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes > self.region_bytes:
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
        copies = self._regions(nbytes).view(tensor.dtype).view(self.world, -1).unbind()
        self.calls += 1
        if copies[self.rank].data_ptr() != tensor.data_ptr():  # not already written in place (`next_regions`)
            copies[self.rank].copy_(tensor.reshape(-1))
        dist.barrier(group=self.group)
        return list(copies)

    def next_regions(self, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        """Every rank's region for this rank's next exchange of `numel` elements each, as one flat
        tensor in rank order: a caller that writes its own region in place saves the copy into
        shared memory. None when the buffer would first have to grow (or has failed)."""
        nbytes = numel * dtype.itemsize
        if self.failed is not None or nbytes > self.region_bytes:
            return None
        return self._regions(nbytes).view(dtype)

    def holds(self, tensor: torch.Tensor) -> bool:
        """Whether `tensor` lies in the shared buffer (and is overwritten two exchanges on)."""
        base = self.buffer.data_ptr()
        return self.buffer.numel() > 0 and base <= tensor.data_ptr() < base + self.buffer.numel()

    def _regions(self, nbytes: int) -> torch.Tensor:
        start = (self.calls % 2) * self.world * self.region_bytes
        return self.buffer[start:start + self.world * nbytes]

    def _grow(self, nbytes: int) -> None:
        """Replace the buffer by one whose regions hold `nbytes` (collective). The pages are
        reserved up front: a /dev/shm too small to hold them fails here on every rank, not as a
        SIGBUS on first touch."""
        region = -(-max(nbytes, self.region_bytes * 2) // _PAGE) * _PAGE
        size = 2 * self.world * region
        self.generation += 1
        path = self.shm_dir / f"trainops-{self.token}-{self.generation}"
        mapped: list[torch.Tensor] = []
        try:
            if self.rank == 0:
                _UNMAPPED.add(path)
            self._agree(_try(lambda: _reserve(path, size)) if self.rank == 0 else None,
                        f"reserving {size / 2**20:.0f} MiB in {self.shm_dir}")
            self._agree(_try(lambda: mapped.append(_map(path, size))), "mapping the buffer")
        finally:
            if self.rank == 0:
                path.unlink(missing_ok=True)
                _UNMAPPED.discard(path)
        self._agree(self._unshared(mapped[0]), "seeing the other ranks' writes in the buffer (one host name on "
                    "several machines, or a private /dev/shm each?)")
        self.buffer, self.region_bytes = mapped[0], region

    def _unshared(self, buffer: torch.Tensor) -> str | None:
        """What shows that this rank does not share `buffer` with the others, if anything: each
        writes a random nonce into it, and each must read every rank's nonce back."""
        nonce = secrets.token_bytes(8)
        buffer[self.rank * 8:(self.rank + 1) * 8] = torch.frombuffer(bytearray(nonce), dtype=torch.uint8)
        nonces: list[bytes | None] = [None] * self.world
        dist.all_gather_object(nonces, nonce, group=self.group)  # every rank has written its nonce by now
        unseen = [rank for rank, sent in enumerate(nonces) if bytes(buffer[rank * 8:(rank + 1) * 8].tolist()) != sent]
        return f"ranks {unseen}'s writes are not in this rank's buffer" if unseen else None

    def _agree(self, problem: str | None, what: str) -> None:
        """All ranks learn whether any failed, so all raise together instead of one waiting forever."""
        failed = torch.tensor([0 if problem is None else 1], dtype=torch.int32)
        dist.all_reduce(failed, group=self.group)
        if failed.item():
            raise SharedMemoryUnavailable(f"{what} failed on {failed.item()} of {self.world} ranks"
                                          + (f" (here: {problem})" if problem else ""))


def unlink_unmapped() -> None:
    """Unlink the buffers this process made whose peers have not all mapped them yet (a SIGTERM
    handler's cleanup: the normal path unlinks them a few milliseconds later)."""
    for path in list(_UNMAPPED):
        path.unlink(missing_ok=True)


def _map(path: Path, nbytes: int) -> torch.Tensor:
    """The buffer file the group's first rank made, mapped; never made here (a missing file means
    this rank does not see that rank's /dev/shm), and refused unless it is this user's and whole."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        found = os.fstat(fd)
        if found.st_uid != os.getuid() or found.st_size != nbytes:
            raise OSError(f"{path} is not the buffer made for this job (owner uid {found.st_uid}, "
                          f"{found.st_size} bytes)")
        return torch.frombuffer(mmap.mmap(fd, nbytes), dtype=torch.uint8)
    finally:
        os.close(fd)


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
    """What FSDP2's custom collectives share: the buffers, and plain memory for what FSDP keeps."""
    def __init__(self, buffers: SharedBuffers):
        self.buffers = buffers

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)


class SharedMemoryReduceScatter(_ThroughBuffers, ReduceScatter):
    """FSDP2's gradient reduce-scatter, through `buffers` (sum or average; other ops go to gloo).
    FSDP allocates the input, which it fills with the gradients, then the output, which becomes
    the sharded gradients: the input is made in this rank's region of the buffer, so the
    gradients are published where FSDP writes them; the output stays in plain memory."""
    def __init__(self, buffers: SharedBuffers):
        super().__init__(buffers)
        self.output_next = False

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        is_input, self.output_next = not self.output_next, not self.output_next
        numel = math.prod(size)
        regions = self.buffers.next_regions(numel, dtype) if is_input else None
        if regions is None:
            return super().allocate(size, dtype=dtype, device=device)
        return regions[self.buffers.rank * numel:(self.buffers.rank + 1) * numel].view(size)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 op=dist.ReduceOp.SUM, async_op: bool = False):
        self.output_next = False
        if self.buffers.holds(output_tensor):
            raise RuntimeError("FSDP allocated its reduce-scatter output before the input: this torch "
                               "version calls the custom collective differently; set "
                               "parallel.cpu_collectives=gloo")
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
    """FSDP2's parameter all-gather, through `buffers`. With `in_place` (a model that is one FSDP
    unit, whose gather FSDP copies out before any other collective), the output is made in the
    buffer itself: FSDP writes its shard into this rank's region and reads the gathered
    parameters from there, and no copy is made at all. FSDP copies the output out right after
    waiting on the returned work; a collective before that is refused (`SharedBuffers.exchange`)."""
    def __init__(self, buffers: SharedBuffers, in_place: bool = False):
        super().__init__(buffers)
        self.in_place = in_place

    def allocate(self, size, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        regions = self.buffers.next_regions(math.prod(size) // self.buffers.world, dtype) if self.in_place else None
        return regions.view(size) if regions is not None else super().allocate(size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup,
                 async_op: bool = False):
        copies = self.buffers.exchange(input_tensor) if self.buffers.serves(group) else None
        if copies is None:
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        if self.buffers.holds(output_tensor):  # gathered where it was published
            self.buffers.unread_gather = True
            return _CopiedOut(self.buffers)
        shard, out = input_tensor.numel(), output_tensor.view(-1)
        for rank, copy in enumerate(copies):
            piece = out[rank * shard:(rank + 1) * shard]
            if piece.data_ptr() != input_tensor.data_ptr():  # FSDP gathers in place: its own shard is there
                piece.copy_(copy)
        return None


class _CopiedOut(dist.Work):
    """The work FSDP waits on just before it copies a gather out of the buffer."""
    def __init__(self, buffers: SharedBuffers):
        super().__init__()
        self.buffers = buffers

    def wait(self, timeout=None) -> bool:
        self.buffers.unread_gather = False
        return True


def ddp_allreduce_hook(buffers: SharedBuffers, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's gradient average for one bucket, through `buffers` (register with
    `DistributedDataParallel.register_comm_hook(buffers, ddp_allreduce_hook)`)."""
    flat = bucket.buffer()
    copies = buffers.exchange(flat) if buffers.failed is None else None
    if copies is None:
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
