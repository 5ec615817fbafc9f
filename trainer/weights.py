"""Give real values to a model built on the meta device, after it has been split and sharded.

torchtitan's pattern: build the model on `meta` (no memory), split it into pipeline stages and
apply TP/FSDP while it is still empty, then `to_empty` on the real device and fill each
parameter. The values come from a function of the parameter's name that returns the *full*
tensor (the seeded initialiser, or a Hugging Face checkpoint read one tensor at a time); a
sharded parameter keeps only its own slice. So every layout holds the same model, and a rank
never holds more than one full parameter at a time beyond its shards.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

FullValue = Callable[[str, torch.Size], torch.Tensor]

_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def canonical_name(name: str) -> str:
    """The parameter's name in the unwrapped model (activation checkpointing and torch.compile
    insert a module level of their own)."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def is_meta(model: nn.Module) -> bool:
    return any(param.is_meta for param in model.parameters())


def local_slice(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """The part of `full` that `param` holds on this rank: all of it for a plain tensor, the
    DTensor's shard (FSDP2, TP or both) otherwise, computed without communication."""
    if not hasattr(param, "device_mesh"):
        return full

    shape, offset = compute_local_shape_and_global_offset(full.shape, param.device_mesh, param.placements)
    return full[tuple(slice(start, start + size) for start, size in zip(offset, shape, strict=True))]


def materialize(model: nn.Module, device: torch.device, full_value: FullValue) -> None:
    """Allocate `model`'s (meta) parameters on `device` and fill them from `full_value`.

    `model` is a Transformer or a pipeline part of one, possibly wrapped by TP, activation
    checkpointing, compile and FSDP2, but not yet by DDP (which broadcasts real values when it
    wraps). Tied embeddings must still be unsharded: `to_empty` gives each module a parameter
    of its own, and the tie is restored here."""
    model.to_empty(device=device)
    if getattr(model.args, "tie_embeddings", False) and model.output is not None and model.tok_embeddings is not None:
        model.output.weight = model.tok_embeddings.weight
    with torch.no_grad():
        for name, param in model.named_parameters():
            full = full_value(canonical_name(name), param.shape)
            local = param.to_local() if hasattr(param, "to_local") else param
            local.copy_(local_slice(full, param).to(local.dtype))
        model.init_rope()
