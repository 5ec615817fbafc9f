"""Apply parallelism to a plain `Transformer`, in torchtitan's fixed order:
tensor parallel -> activation checkpointing -> per-block compile -> DDP or FSDP2.

The model file knows nothing of this; the mesh comes from one validated `Layout`. A model
built on the meta device is given its values here, once sharded (trainops.trainer.weights).
"""
from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from trainops.trainer.config import AUTO_COMPILE_MIN_STEPS, JobConfig
from trainops.trainer.layout import MESH_DIM_NAMES, Layout
from trainops.trainer.model import initial_weight
from trainops.trainer.shared_memory_comm import (
    SharedMemoryAllGather,
    SharedMemoryReduceScatter,
    ddp_allreduce_hook,
    shared_buffers_for,
)
from trainops.trainer.weights import FullValue, is_meta, materialize

if TYPE_CHECKING:
    from trainops.trainer.shared_memory_comm import SharedBuffers

DP_DIMS = ("dp_replicate", "dp_shard")


@dataclass
class MeshInfo:
    """The mesh and what the training loop needs from it: its data-parallel slice."""
    mesh: DeviceMesh
    layout: Layout
    dp_rank: int
    dp_degree: int


def build_mesh(layout: Layout, device_type: str) -> MeshInfo:
    """One mesh over all named dims (size-1 dims included, so submesh names always resolve)."""
    mesh = init_device_mesh(device_type, layout.mesh_shape, mesh_dim_names=MESH_DIM_NAMES)
    replicate_rank, shard_rank = (mesh.get_local_rank(dim) for dim in DP_DIMS)
    return MeshInfo(mesh=mesh, layout=layout, dp_rank=replicate_rank * layout.dp_shard + shard_rank,
                    dp_degree=layout.dp)


def replica_group(info: MeshInfo, data_parallel: str) -> str:
    """Ranks with the same key hold identical parameters: DDP replicates across both data-parallel
    dims, FSDP only across dp_replicate (HSDP)."""
    replicated = DP_DIMS if data_parallel == "ddp" else ("dp_replicate",)
    return ",".join(f"{dim}{info.mesh.get_local_rank(dim)}" for dim in MESH_DIM_NAMES if dim not in replicated)


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """full: recompute every block in backward; selective: every other block (layer-level SAC,
    about half the activation memory for about half the recompute)."""
    if mode == "none":
        return

    for index, (name, block) in enumerate(list(model.layers.items())):
        if mode == "full" or index % 2 == 0:
            model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: nn.Module) -> None:
    """Compile each block separately: identical blocks share one compiled graph, and the
    FSDP hooks between blocks stay outside the graphs."""
    for name, block in list(model.layers.items()):
        model.layers[name] = torch.compile(block, fullgraph=True)


def compile_blocks(cfg: JobConfig, device_type: str) -> bool:
    """`training.compile` resolved for this run; rank 0 says what was decided and why."""
    setting, steps = cfg.training.compile, cfg.training.steps
    if setting != "auto":
        decided, why = setting, f"training.compile={str(setting).lower()}"
    elif steps < AUTO_COMPILE_MIN_STEPS:
        decided, why = False, f"auto: a {steps}-step run is shorter than the {AUTO_COMPILE_MIN_STEPS} that pay back " \
                              "the compile time"
    elif problem := compile_problem(device_type):
        decided, why = False, f"auto: inductor cannot build kernels here ({problem})"
    else:
        decided, why = True, f"auto: a {steps}-step run pays back the compile time"
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(f"transformer blocks {'compiled' if decided else 'eager'} ({why})", flush=True)
    return decided


def compile_problem(device_type: str) -> str | None:
    """Why torch.compile cannot build kernels on this device, or None: it compiles a small function
    whose constant is drawn at random, so no cached kernel stands in for a working compiler (a
    C++ compiler and Python's headers on the CPU, triton on a GPU). Seconds, on long runs only."""
    scale = random.random()
    try:
        torch.compile(lambda x: x * scale + 1.0, fullgraph=True)(torch.ones(8, device=device_type))
    except Exception as error:  # inductor fails in many ways, and an eager run needs none of it
        first_line = (str(error).strip().splitlines() or [""])[0]
        return f"{type(error).__name__}: {first_line[:200]}"
    return None


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh, precision: str, reshard_after_forward: bool,
               unit_params: int = 0, buffers: SharedBuffers | None = None) -> None:
    """FSDP2: consecutive blocks sharded together as one unit (one all-gather, one reduce-scatter)
    until a unit holds `unit_params` parameters, then the root (embeddings, norm, output and any
    blocks left over). 0 gives torchtitan's one unit per block. With `buffers`, every unit's
    collectives go through shared memory (trainops.trainer.shared_memory_comm)."""
    def shard(module: nn.Module, reshard_after_forward: bool | None, only_unit: bool = False) -> None:
        fully_shard(module, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
        if buffers is not None:
            module.set_custom_reduce_scatter(SharedMemoryReduceScatter(buffers))
            module.set_custom_all_gather(SharedMemoryAllGather(buffers, in_place=only_unit))

    mp_policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if precision == "bf16" else torch.float32,
        reduce_dtype=torch.float32,
    )
    units = fsdp_units(list(model.layers.values()), unit_params)
    for index, unit in enumerate(units):
        # the last unit's parameters are needed again at once by backward: keep them gathered
        shard(unit if len(unit) > 1 else unit[0], reshard_after_forward and index < len(units) - 1)
    # None is torch's own rule for the root: backward needs its parameters (the output head) first, so
    # freeing them after forward would only gather them again at once (18 ms of a 350 ms CPU step)
    shard(model, None if reshard_after_forward else False, only_unit=not units)


def fsdp_units(blocks: list[nn.Module], unit_params: int) -> list[list[nn.Module]]:
    """Group consecutive blocks until each group holds at least `unit_params` parameters (FSDP1's
    size-based wrap policy); a last group short of it stays with the root."""
    units, unit, size = [], [], 0
    for block in blocks:
        unit.append(block)
        size += sum(p.numel() for p in block.parameters())
        if size >= unit_params:
            units.append(unit)
            unit, size = [], 0
    return units


def fsdp_unit_params(cfg: JobConfig, device_type: str) -> int:
    """`parallel.fsdp_unit_params`, with auto (-1) resolved for the device: one unit per block on
    accelerators, whose prefetch overlaps a block's gather with the previous block's compute; the
    whole model as one unit on the CPU, where gloo's collectives run on the cores that compute, so
    every extra collective only adds latency (50 ms of a 375 ms step at the issue-17 shape)."""
    unit_params = cfg.parallel.fsdp_unit_params
    if unit_params >= 0:
        return unit_params
    return 0 if device_type != "cpu" else sys.maxsize


def _dp_mesh(info: MeshInfo) -> DeviceMesh:
    layout = info.layout
    if layout.dp_replicate > 1 and layout.dp_shard > 1:
        return info.mesh[DP_DIMS]
    return info.mesh["dp_replicate" if layout.dp_replicate > 1 else "dp_shard"]


def mesh_device(info: MeshInfo) -> torch.device:
    """This rank's device: where a meta-built model's shards are allocated."""
    if info.mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(info.mesh.device_type)


def seeded_init(cfg: JobConfig, args) -> FullValue:
    """The full initial value of each parameter, from `training.seed` (trainops.trainer.model)."""
    return partial(initial_weight, args, seed=cfg.training.seed)


def parallelize(model: nn.Module, cfg: JobConfig, info: MeshInfo, full_value: FullValue | None = None) -> nn.Module:
    """Return the model ready to train on this rank (wrapped by DDP when data_parallel=ddp).

    A meta-device model is materialized from `full_value` (default: the seeded init) after
    FSDP2 has sharded it, so no rank allocates more than its shards; before DDP, which needs
    real values to broadcast, and before FSDP2 for tied embeddings, whose tie `to_empty` breaks."""
    pending = is_meta(model)
    fill = full_value or seeded_init(cfg, model.args)
    if cfg.parallel.tp > 1:
        # tensor parallel's plans load torch._inductor (~0.5 s of CPU per process): only a tp > 1 run pays it
        from trainops.trainer.parallel.tp import apply_tp  # noqa: PLC0415

        apply_tp(model, info.mesh["tp"], cfg)
    apply_activation_checkpointing(model, cfg.training.activation_checkpointing)
    if cfg.training.compile is True:  # resolved once per rank by train() (compile_blocks); auto stays eager
        apply_compile(model)
    fsdp = info.dp_degree > 1 and cfg.parallel.data_parallel == "fsdp"
    if pending and (not fsdp or model.args.tie_embeddings):
        materialize(model, mesh_device(info), fill)
        pending = False
    if info.dp_degree == 1:
        return model
    if fsdp:
        # HSDP when both dims are > 1: shard within dp_shard, replicate across dp_replicate
        dp_mesh = _dp_mesh(info)
        shard_group = dp_mesh.get_group(dp_mesh.ndim - 1)  # HSDP: the shard dim carries FSDP's collectives
        apply_fsdp(model, dp_mesh, cfg.training.precision, cfg.parallel.reshard_after_forward,
                   fsdp_unit_params(cfg, info.mesh.device_type),
                   collective_buffers(cfg, shard_group, info.mesh.device_type))
        if pending:
            materialize(model, mesh_device(info), fill)
        return model

    dp_mesh = info.mesh[DP_DIMS]._flatten("dp") if info.layout.dp_replicate > 1 and \
        info.layout.dp_shard > 1 else _dp_mesh(info)
    device_ids = [torch.cuda.current_device()] if info.mesh.device_type == "cuda" else None
    # broadcast_buffers off: the model's one buffer, the RoPE table, is computed alike on every rank
    group = dp_mesh.get_group()
    wrapped = DistributedDataParallel(model, process_group=group, device_ids=device_ids, broadcast_buffers=False)
    buffers = collective_buffers(cfg, group, info.mesh.device_type)
    if buffers is not None:
        wrapped.register_comm_hook(buffers, ddp_allreduce_hook)
    return wrapped


def collective_buffers(cfg: JobConfig, group, device_type: str) -> SharedBuffers | None:
    """Shared-memory buffers for the data-parallel `group` when `parallel.cpu_collectives` and the
    run allow them (collective over the group); rank 0 says which way the collectives go."""
    buffers = shared_buffers_for(group, cfg.parallel.cpu_collectives, device_type)
    if group.rank() == 0:
        way = "shared memory" if buffers is not None else "the process group's backend"
        print(f"data-parallel collectives over {group.size()} ranks: {way} (parallel.cpu_collectives="
              f"{cfg.parallel.cpu_collectives})", flush=True)
    return buffers
