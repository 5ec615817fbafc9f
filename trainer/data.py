"""Deterministic input data, sharded by data-parallel rank, with a resumable position.

Sample `g` of the run is a pure function of (seed, g): the optimizer step `s` consumes global
samples `s*global_batch ... (s+1)*global_batch - 1`, and data-parallel rank `r` of `D` takes the
`r`-th contiguous slice of them. So one process with gradient accumulation and D processes see
the same global batch at every step, and the position (the next step) is all a checkpoint
needs to resume exactly, even with a different data-parallel degree.
"""
from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

import torch

from trainops.trainer.config import DataConfig

DEFAULT_TEXT = Path(str(resources.files("trainops.trainer") / "text" / "public_domain_excerpts.txt"))


class SyntheticTokens:
    """Arithmetic sequences modulo the vocabulary: random start and stride per sample, so the
    data is deterministic, has learnable structure (loss can fall) and costs no I/O."""

    def __init__(self, vocab_size: int, seq_len: int, seed: int):
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed

    def sample(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        start = int(torch.randint(self.vocab_size, (1,), generator=generator))
        stride = int(torch.randint(1, 8, (1,), generator=generator))
        positions = torch.arange(self.seq_len + 1)
        return (start + stride * positions) % self.vocab_size


class ByteText:
    """Byte-level tokens (vocabulary 256) of a text file, cut into windows of seq_len+1 bytes,
    visited in a seeded random order that is reshuffled every epoch."""

    def __init__(self, path: Path, seq_len: int, seed: int):
        raw = path.read_bytes()
        if len(raw) < seq_len + 1:
            raise ValueError(f"data.path {str(path)!r} has {len(raw)} bytes; training.seq_len={seq_len} "
                             "needs at least seq_len+1: use a longer text or a shorter seq_len")
        self.tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
        self.seq_len, self.seed = seq_len, seed
        self.windows = (len(raw) - 1) // seq_len
        self._order: tuple[int, torch.Tensor] | None = None

    def sample(self, index: int) -> torch.Tensor:
        epoch, within = divmod(index, self.windows)
        if self._order is None or self._order[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 7919 + epoch)
            self._order = (epoch, torch.randperm(self.windows, generator=generator))
        start = int(self._order[1][within]) * self.seq_len
        return self.tokens[start:start + self.seq_len + 1]


class DataLoader:
    """Yields this rank's micro-batches `(inputs, labels)`, step by step, and times the wait."""

    def __init__(self, cfg: DataConfig, *, vocab_size: int, seq_len: int, seed: int,
                 global_batch: int, micro_batch: int, dp_rank: int = 0, dp_degree: int = 1):
        if global_batch % (dp_degree * micro_batch):
            raise ValueError(
                f"training.global_batch ({global_batch}) must be a multiple of data-parallel degree "
                f"({dp_degree}) x training.micro_batch ({micro_batch}); change one of them")
        if cfg.kind == "text":
            self.source: SyntheticTokens | ByteText = ByteText(
                Path(cfg.path) if cfg.path else DEFAULT_TEXT, seq_len, seed)
        else:
            self.source = SyntheticTokens(vocab_size, seq_len, seed)
        self.global_batch, self.micro_batch = global_batch, micro_batch
        self.dp_rank, self.dp_degree = dp_rank, dp_degree
        self.accumulation_steps = global_batch // (dp_degree * micro_batch)
        self.step = 0
        self.data_wait_s = 0.0

    def next_step(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The micro-batches of this rank for the next optimizer step."""
        started = time.perf_counter()
        per_rank = self.global_batch // self.dp_degree
        first = self.step * self.global_batch + self.dp_rank * per_rank
        micro_batches = []
        for micro in range(self.accumulation_steps):
            offset = first + micro * self.micro_batch
            rows = torch.stack([self.source.sample(offset + i) for i in range(self.micro_batch)])
            micro_batches.append((rows[:, :-1].contiguous(), rows[:, 1:].contiguous()))
        self.step += 1
        self.data_wait_s += time.perf_counter() - started
        return micro_batches

    def pop_data_wait_s(self) -> float:
        """Seconds spent producing data since the last call (the trainer reports it per step)."""
        waited, self.data_wait_s = self.data_wait_s, 0.0
        return waited

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step, "global_batch": self.global_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state["global_batch"]) != self.global_batch:
            raise ValueError(f"checkpoint was taken with training.global_batch={state['global_batch']}, "
                             f"this run uses {self.global_batch}: resume with the same global batch")
        self.step = int(state["step"])
