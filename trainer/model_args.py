"""The model's shape without torch: its arguments, the named presets and the parameter counts
planning reads from them. The config, the layout planner and the CLI import this, not `model.py`,
so validating a job config never loads torch."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1/3.2 RoPE frequency scaling (HF `rope_type: "llama3"`): wavelengths longer than
    the original context / low_freq_factor are slowed by `factor`, shorter than original /
    high_freq_factor kept, and those between interpolated smoothly."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass
class ModelArgs:
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = 2
    vocab_size: int = 256
    ffn_hidden_dim: int = 512
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    max_seq_len: int = 256
    tie_embeddings: bool = False

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads


PRESETS: dict[str, ModelArgs] = {
    # a few million parameters: tests and the CPU demo (byte tokenizer, vocab 256)
    "tiny": ModelArgs(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, vocab_size=256,
                      ffn_hidden_dim=384, max_seq_len=256),
    # ~40M parameters: a GPU smoke test that still fits anywhere
    "small": ModelArgs(dim=512, n_layers=8, n_heads=8, n_kv_heads=4, vocab_size=32000,
                       ffn_hidden_dim=1536, max_seq_len=1024),
    # the published Llama 3 / 3.2 shapes, for planning (memory, FLOPs, layouts)
    "llama3-1b": ModelArgs(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256,
                           ffn_hidden_dim=8192, rope_theta=500000.0, max_seq_len=8192,
                           rope_scaling=Llama3RopeScaling(factor=32.0, low_freq_factor=1.0,
                                                          high_freq_factor=4.0,
                                                          original_max_position_embeddings=8192),
                           tie_embeddings=True),
    "llama3-8b": ModelArgs(dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, vocab_size=128256,
                           ffn_hidden_dim=14336, rope_theta=500000.0, max_seq_len=8192),
    "llama3-70b": ModelArgs(dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, vocab_size=128256,
                            ffn_hidden_dim=28672, rope_theta=500000.0, max_seq_len=8192),
}


def preset(name: str, **overrides) -> ModelArgs:
    if name not in PRESETS:
        raise KeyError(f"model preset {name!r} is unknown: choose one of {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)


def count_parameters(args: ModelArgs) -> dict[str, int]:
    """Parameter counts from the shapes alone (no allocation), for planning the big presets."""
    head_dim, kv = args.head_dim, args.kv_heads
    attention = args.dim * (args.n_heads * head_dim) * 2 + args.dim * (kv * head_dim) * 2
    feed_forward = 3 * args.dim * args.ffn_hidden_dim
    per_layer = attention + feed_forward + 2 * args.dim
    embedding = args.vocab_size * args.dim
    output = 0 if args.tie_embeddings else args.vocab_size * args.dim
    total = embedding + args.n_layers * per_layer + args.dim + output
    return {"total": total, "embedding": embedding, "per_layer": per_layer}
