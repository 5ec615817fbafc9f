"""Tensor parallel (Megatron-style column/row split) and sequence parallel with DTensor.

One plan dict per module, torchtitan style: attention and SwiGLU are split column-then-row so
each block needs one all-reduce forward (or, with sequence parallel, an all-gather before and
a reduce-scatter after, the norms working on sequence shards). Grouped-query attention splits
whole kv heads: tp must divide n_kv_heads (checked by `trainops.trainer.layout`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch._inductor.config as inductor_config
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)


def block_plan(sequence_parallel: bool) -> dict[str, Any]:
    """The plan for one `TransformerBlock`, keyed by submodule name."""
    if not sequence_parallel:
        return {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        }
    return {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def top_plan(model: nn.Module, sequence_parallel: bool) -> dict[str, Any]:
    """Embedding, final norm and output head; absent ones (pipeline stages) are skipped."""
    hidden = Shard(1) if sequence_parallel else Replicate()
    plan: dict[str, Any] = {}
    if getattr(model, "tok_embeddings", None) is not None:
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=hidden)
    if sequence_parallel and getattr(model, "norm", None) is not None:
        plan["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        plan["output"] = ColwiseParallel(input_layouts=hidden, output_layouts=Replicate(), use_local_output=True)
    return plan


def replicate_norms(model: nn.Module, tp_mesh) -> None:
    """Without sequence parallel the norms see full activations; their weights still become
    Replicate DTensors, so every parameter is a DTensor (gradient clipping and the optimizer's
    foreach kernels refuse a mix) while the norm itself computes on plain tensors."""
    def to_dtensor(_module, inputs, mesh):
        return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                     if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)

    def to_local(_module, output, _mesh):
        return output.to_local() if isinstance(output, DTensor) else output

    norms = [block.attention_norm for block in model.layers.values()] + [block.ffn_norm
                                                                         for block in model.layers.values()]
    if getattr(model, "norm", None) is not None:
        norms.append(model.norm)
    for norm in norms:
        distribute_module(norm, tp_mesh, input_fn=to_dtensor, output_fn=to_local)


def tp_submesh(mesh):
    """Accept the whole named mesh or its `tp` submesh."""
    names = getattr(mesh, "mesh_dim_names", None) or ()
    return mesh["tp"] if len(names) > 1 and "tp" in names else mesh


def apply_tp(model: nn.Module, mesh, cfg) -> nn.Module:
    """Shard `model` (a whole `Transformer` or a pipeline stage of one) over the tp mesh in place.

    A pipeline stage that is neither first nor last takes and returns the hidden states; with
    sequence parallel those travel between stages as sequence shards (plain local tensors).
    """

    tp_mesh = tp_submesh(mesh)
    sequence_parallel = bool(cfg.parallel.sequence_parallel)
    if getattr(getattr(model, "args", None), "tie_embeddings", False) and tp_mesh.size() > 1:
        raise ValueError("model.tie_embeddings=true cannot be tensor-parallel: the embedding splits rows and "
                         "the output head columns of one weight; set model.tie_embeddings=false or parallel.tp=1")
    if getattr(cfg.parallel, "comm_overlap", False):
        # async TP: inductor splits the SP all-gather / reduce-scatter and overlaps them with the GEMMs
        inductor_config._micro_pipeline_tp = True
    parallelize_module(model, tp_mesh, top_plan(model, sequence_parallel))
    plan = block_plan(sequence_parallel)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, plan)
    if not sequence_parallel:
        replicate_norms(model, tp_mesh)
    return model
