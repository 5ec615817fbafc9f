"""A whole model read back from a Hugging Face folder in one process, for the tests' round trips
(export, then compare logits or weights). The trainer itself never builds one this way: each rank
loads its own shard of an `--init-from` folder (trainops.trainer.weights.materialize)."""
from __future__ import annotations

from pathlib import Path

import torch

from trainops.trainer.hf import HFCheckpoint
from trainops.trainer.model import Transformer
from trainops.trainer.weights import materialize


def import_hf(folder: str | Path) -> Transformer:
    """Build an fp32 `Transformer` from an HF Llama folder (one safetensors file or an index of shards).

    fp32 because these become master weights; mixed precision casts per op. (Casting the
    module with `.to(dtype)` would also drop the imaginary part of the complex RoPE buffer.)"""
    checkpoint = HFCheckpoint(folder)
    with torch.device("meta"):
        model = Transformer(checkpoint.args)
    materialize(model, torch.device("cpu"), checkpoint.tensor)
    return model
