"""One reader per replica group: on resume, one rank of each data-parallel replica group reads its
part of a checkpoint from storage and broadcasts it to the group, so storage reads do not grow with
the number of replicas (the seed's "slow recovery" row: one worker per data-parallel group reads).

The readers run `dcp.load` together (their own process group: one replica each, so they cover
the checkpoint) through trainops.trainer.checkpoint_reader, which reads every file a reader needs
once, whole, and checks its sha256 before DCP copies from it: verification costs no second read.
The readers agree on the verdict before any tensor is written, and every rank then agrees on it: a
corrupt file makes the whole job fall back to the previous checkpoint together. The group's other
ranks receive the reader's model and optimizer tensors by broadcast (bucketed by dtype), the rest
(step, scheduler, loader position, each member's RNG) as one object. DCP's own broadcast
(`set_state_dict` with `broadcast_from_rank0`) does not fit: it needs the full, unsharded state on
global rank 0 (the whole model in one rank's memory under FSDP2) and broadcasts over the whole
world, not per replica group.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from trainops.trainer.checkpoint_reader import CountedReader, corrupt_reason
from trainops.trainer.layout import MESH_DIM_NAMES, Layout

BUCKET_BYTES = 64 << 20  # one broadcast carries at most this much of one dtype
TENSOR_TREES = ("model", "optimizer")  # what is broadcast as tensors, the same layout on every replica


def replica_groups(layout: Layout, data_parallel: str) -> list[list[int]]:
    """Ranks that hold identical model and optimizer state, each group sorted, groups by first rank.
    DDP replicates over both data-parallel dims; FSDP2 only over dp_replicate when dp_shard shards
    too (HSDP): FSDP2 on one dp dim of size > 1 shards over it, whichever it is named."""
    if data_parallel == "ddp":
        replicated = {"dp_replicate", "dp_shard"}
    elif layout.dp_replicate > 1 and layout.dp_shard > 1:
        replicated = {"dp_replicate"}
    else:
        replicated = set()
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank in range(layout.world_size):
        coords = layout.coords(rank)
        groups.setdefault(tuple(coords[d] for d in MESH_DIM_NAMES if d not in replicated), []).append(rank)
    return sorted(groups.values())


def read_one_per_group(app, folder: Path, listed: dict[str, Any], groups: list[list[int]], spent: list[int],
                       rng_state: Callable[[], dict[str, Any]]) -> str | None:
    """Load `app` (trainops.trainer.checkpoint.AppState) from `folder`: the first rank of each replica
    group reads (verifying as it reads), the others receive; `spent` gains this rank's storage bytes.
    Returns why the checkpoint is corrupt (the same on every rank), or None once it is loaded."""
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    members = next(g for g in groups if rank in g)
    readers = [g[0] for g in groups]
    # new_group is collective over the world: every rank makes every group, in the same order
    group_pgs = {g[0]: dist.new_group(g) for g in groups if len(g) > 1} if distributed else {}
    several = len(readers) > 1
    readers_pg = dist.new_group(readers) if several and len(readers) < world else None
    own = app.state_dict()
    state, verdict = None, None
    if rank == members[0]:
        state = {k: v for k, v in own.items() if k != "rng"}
        if rng := {f"rank{r}": rng_state() for r in members if r < (app.saved_world_size or 0)}:
            state["rng"] = rng  # the RNG each member saved, read for it
        storage = CountedReader(folder, listed, agree_group=readers_pg, agree=several)
        holder = {"app": state}
        try:
            dcp.load(holder, storage_reader=storage, process_group=readers_pg, no_dist=not several)
        except (Exception, CheckpointException) as error:  # DCP gathers every reader's failure
            verdict = corrupt_reason(error) or f"error: {type(error).__name__}: {str(error)[:2000]}"
        spent[0] += storage.fs.bytes_read
        state = holder["app"]
    verdicts = [verdict]
    if distributed:
        verdicts = [None] * world
        dist.all_gather_object(verdicts, verdict)
    if errors := sorted({v for v in verdicts if v and v.startswith("error: ")}):
        raise RuntimeError(f"loading checkpoint {folder} failed on a reader: {errors[0][7:]}")
    if problems := sorted({v for v in verdicts if v}):
        return "; ".join(problems)
    if len(members) > 1:
        state = share(state, own, members[0], group_pgs[members[0]])
    app.load_state_dict(state)
    return None


# ---------------------------------------------------------------- the broadcast within a group


def _skeleton(tree: Any, path: tuple, tensors: list[tuple[tuple, torch.Tensor]]) -> Any:
    """`tree` with each tensor replaced by its path (collected in `tensors`, in walk order)."""
    if isinstance(tree, torch.Tensor):
        tensors.append((path, tree))
        return _Slot(path, tuple(tree.shape), str(tree.dtype), _chunks(tree))
    if isinstance(tree, dict):
        return {k: _skeleton(v, (*path, k), tensors) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_skeleton(v, (*path, i), tensors) for i, v in enumerate(tree))
    return tree


def _fill(tree: Any, values: dict[tuple, torch.Tensor]) -> Any:
    if isinstance(tree, _Slot):
        return values[tree.path]
    if isinstance(tree, dict):
        return {k: _fill(v, values) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_fill(v, values) for v in tree)
    return tree


class _Slot:
    """Where the reader's state held a tensor: its path, shape, dtype and, for a DTensor, the
    global chunk this rank holds (a member that holds another chunk is no replica of the reader)."""
    def __init__(self, path: tuple, shape: tuple, dtype: str, chunks: list | None) -> None:
        self.path, self.shape, self.dtype, self.chunks = path, shape, dtype, chunks


def _chunks(tensor: torch.Tensor) -> list | None:
    if not hasattr(tensor, "__create_chunk_list__"):
        return None
    return [(tuple(c.offsets), tuple(c.sizes)) for c in tensor.__create_chunk_list__()]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor._local_tensor if hasattr(tensor, "_local_tensor") else tensor


def share(state: dict[str, Any] | None, own: dict[str, Any], reader: int, group) -> dict[str, Any]:
    """The reader's loaded `state` on every member of `group`: its model and optimizer tensors
    broadcast into this member's own (`own`, its current state dict, same layout), the rest as one
    object. On the reader, `state` is returned as it is."""
    tensors: list[tuple[tuple, torch.Tensor]] = []
    payload = [_split(state, tensors) if state is not None else None]
    dist.broadcast_object_list(payload, src=reader, group=group)
    skeleton = payload[0]
    if state is None:
        mine: list[tuple[tuple, torch.Tensor]] = []
        _split(own, mine)
        by_path = dict(mine)
        slots: list[_Slot] = []
        _collect_slots(skeleton, slots)
        for slot in slots:
            tensor = by_path.get(slot.path)
            if tensor is None or tuple(tensor.shape) != slot.shape or str(tensor.dtype) != slot.dtype \
                    or _chunks(tensor) != slot.chunks:
                raise RuntimeError(f"replica-group load: rank {dist.get_rank()} holds no replica of the reader's "
                                   f"{'.'.join(map(str, slot.path))}; set checkpoint.load_readers=every_rank")
            tensors.append((slot.path, tensor))
    _broadcast_tensors([_local(t) for _, t in tensors], reader, group)
    return state if state is not None else _fill(skeleton, dict(tensors))


def _split(state: dict[str, Any], tensors: list[tuple[tuple, torch.Tensor]]) -> dict[str, Any]:
    """The state with its model and optimizer tensors replaced by slots; the rest (step, scheduler,
    loader position, each member's RNG) stays whole and travels as part of the object."""
    return {k: _skeleton(v, (k,), tensors) if k in TENSOR_TREES else v for k, v in state.items()}


def _collect_slots(tree: Any, out: list[_Slot]) -> None:
    if isinstance(tree, _Slot):
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            _collect_slots(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            _collect_slots(v, out)


def _broadcast_tensors(tensors: list[torch.Tensor], src: int, group) -> None:
    """Broadcast `tensors` in place, packed into flat buckets of one dtype and device each: a
    broadcast per bucket, not per tensor (gloo pays a round trip per call)."""
    buckets: dict[tuple, list[list[torch.Tensor]]] = {}
    for tensor in tensors:
        runs = buckets.setdefault((tensor.device, tensor.dtype), [[]])
        if runs[-1] and sum(t.numel() * t.element_size() for t in runs[-1]) >= BUCKET_BYTES:
            runs.append([])
        runs[-1].append(tensor)
    sender = dist.get_rank() == src
    for (device, dtype), runs in buckets.items():
        for run in runs:
            flat = torch.cat([t.reshape(-1) for t in run]) if sender else \
                torch.empty(sum(t.numel() for t in run), dtype=dtype, device=device)
            dist.broadcast(flat, src=src, group=group)
            if not sender:
                offset = 0
                for t in run:
                    t.copy_(flat[offset:offset + t.numel()].view(t.shape))
                    offset += t.numel()
