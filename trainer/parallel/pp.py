"""Pipeline parallel with `torch.distributed.pipelining`.

The model is split by layer ranges into `pp x virtual_stages` stages (virtual stages loop
round the ranks; ZBV places them in a V so rank 0 holds the first and the last stage). Each
stage part is a `Transformer` sharing only the layers it owns and, where not first or
last, no embedding, final norm or output head; layer keys keep their global index, so the
checkpoint names of a pipelined model equal those of the whole model (resharding across
layouts needs no renaming). Every part is parallelized (TP, AC, compile, FSDP2) by the caller's
function before it becomes a `PipelineStage`, which is how PP composes with FSDP2 and TP.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, schedules

SCHEDULE_CLASSES = {
    "GPipe": "ScheduleGPipe",
    "1F1B": "Schedule1F1B",
    "Interleaved1F1B": "ScheduleInterleaved1F1B",
    "InterleavedZeroBubble": "ScheduleInterleavedZeroBubble",
    "ZBVZeroBubble": "ScheduleZBVZeroBubble",
}
SINGLE_STAGE_SCHEDULES = ("GPipe", "1F1B")


def split_model(model: nn.Module, layout, pp_rank: int) -> list[tuple[int, nn.Module]]:
    """(stage index, stage part) for every stage `pp_rank` holds, in schedule order. The parts
    share `model`'s modules (nothing is copied), so a model built on the meta device is split
    before any memory is allocated."""
    per_stage = len(model.layers) // layout.num_stages
    last = layout.num_stages - 1
    return [(stage, model.part([str(i) for i in range(stage * per_stage, (stage + 1) * per_stage)],
                               embedding=stage == 0, head=stage == last))
            for stage in layout.stages_of(pp_rank)]


@dataclass
class Pipeline:
    """This rank's stages and the schedule that runs them; `step` replaces forward+backward."""
    schedule: Any
    stage_indices: list[int]
    model_parts: list[nn.Module]
    has_first: bool
    has_last: bool
    pp_group: Any

    def step(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One forward+backward of the local batch (split into micro-batches by the schedule);
        returns the mean micro-batch loss on every pipeline rank. Gradients are averaged over
        micro-batches (`scale_grads`), as gradient accumulation would."""
        losses: list[torch.Tensor] | None = [] if self.has_last else None
        target = labels if self.has_last else None
        if self.has_first:
            self.schedule.step(tokens, target=target, losses=losses)
        else:
            self.schedule.step(target=target, losses=losses)
        device = labels.device
        loss = (torch.stack([stage_loss.detach().float() for stage_loss in losses]).mean() if losses
                else torch.zeros((), device=device))
        dist.all_reduce(loss, group=self.pp_group)  # only the rank holding the last stage adds a non-zero
        return loss

    def parameters(self):
        for part in self.model_parts:
            yield from part.parameters()


def build_pipeline(
    model: nn.Module,
    layout,
    pp_mesh,
    parallelize_part: Callable[[nn.Module], nn.Module],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    device: torch.device,
) -> Pipeline:
    """Split `model` for this rank, parallelize each part, wrap them as stages and build the schedule."""
    if getattr(getattr(model, "args", None), "tie_embeddings", False):
        raise ValueError("model.tie_embeddings=true cannot be pipelined: the embedding and the output head "
                         "live on different stages; set model.tie_embeddings=false or parallel.pp=1")
    pp_rank = pp_mesh.get_local_rank()
    group = pp_mesh.get_group()
    stage_indices, parts, stages = [], [], []
    for index, part in split_model(model, layout, pp_rank):
        part = parallelize_part(part)
        stage_indices.append(index)
        parts.append(part)
        stages.append(PipelineStage(part, stage_index=index, num_stages=layout.num_stages, device=device, group=group))
    schedule_cls = getattr(schedules, SCHEDULE_CLASSES[layout.pp_schedule])
    n_microbatches = layout.grad_accumulation
    if layout.pp_schedule in SINGLE_STAGE_SCHEDULES:
        schedule = schedule_cls(stages[0], n_microbatches=n_microbatches, loss_fn=loss_fn)
    else:
        schedule = schedule_cls(stages, n_microbatches=n_microbatches, loss_fn=loss_fn)
    return Pipeline(
        schedule=schedule, stage_indices=stage_indices, model_parts=parts,
        has_first=0 in stage_indices, has_last=layout.num_stages - 1 in stage_indices, pp_group=group,
    )


def merged_view(parts: list[nn.Module]) -> nn.Module:
    """One module over this rank's stage parts, named like the whole model (`layers.N...`,
    `tok_embeddings`, `norm`, `output`), for checkpoints and gradient clipping. It shares the
    parts' parameters; it is never called."""
    parts = [getattr(part, "module", part) for part in parts]  # unwrap DDP
    if len(parts) == 1:
        return parts[0]
    view = nn.Module()
    view.layers = nn.ModuleDict({name: block for part in parts for name, block in part.layers.items()})
    for name in ("tok_embeddings", "norm", "output"):
        held = [getattr(part, name) for part in parts if getattr(part, name, None) is not None]
        if held:
            setattr(view, name, held[0])
    return view

