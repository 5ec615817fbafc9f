"""A Llama-style decoder in one file (torchtitan naming), knowing nothing of parallelism.

`tok_embeddings`, `norm` and `output` may be set to None so a pipeline stage can hold only
its slice of `layers`; `forward` then passes hidden states straight through.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


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


def rope_frequencies(head_dim: int, seq_len: int, theta: float) -> torch.Tensor:
    """Complex rotations e^(i*pos*theta^(-2k/d)), shape (seq_len, head_dim // 2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels of x (batch, seq, heads, head_dim) by position."""
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rotated = pairs * freqs_cis[: x.shape[1]].view(1, x.shape[1], 1, -1)
    return torch.view_as_real(rotated).flatten(-2).type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


class Attention(nn.Module):
    """Grouped-query attention: n_kv_heads key/value heads shared by n_heads query heads."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.kv_heads, args.head_dim
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 instead of the head count lets tensor parallel shard heads without a change here
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        q, k = apply_rope(q, freqs_cis), apply_rope(k, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        repeats = q.shape[1] // k.shape[1]
        if repeats > 1:
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))

    def init_weights(self, std: float, out_std: float) -> None:
        for linear in (self.wq, self.wk, self.wv):
            nn.init.trunc_normal_(linear.weight, mean=0.0, std=std)
        nn.init.trunc_normal_(self.wo.weight, mean=0.0, std=out_std)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.trunc_normal_(self.w1.weight, mean=0.0, std=std)
        nn.init.trunc_normal_(self.w3.weight, mean=0.0, std=out_std)
        nn.init.trunc_normal_(self.w2.weight, mean=0.0, std=out_std)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)
        # depth-scaled init of the residual projections keeps deep stacks stable
        self.out_std = 0.02 / math.sqrt(2 * (layer_id + 1))

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))

    def init_weights(self) -> None:
        self.attention_norm.reset_parameters()
        self.ffn_norm.reset_parameters()
        self.attention.init_weights(0.02, self.out_std)
        self.feed_forward.init_weights(0.02, self.out_std)


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        if args.dim % args.n_heads:
            raise ValueError(f"model.dim ({args.dim}) must be divisible by model.n_heads ({args.n_heads})")
        if args.n_heads % args.kv_heads:
            raise ValueError(f"model.n_heads ({args.n_heads}) must be divisible by "
                             f"model.n_kv_heads ({args.kv_heads})")
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(i, args) for i in range(args.n_layers)})
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        if args.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # a buffer (not a parameter) so it follows .to(device) but is not trained or sharded
        self.register_buffer("freqs_cis", rope_frequencies(args.head_dim, args.max_seq_len,
                                                           args.rope_theta), persistent=False)

    def init_weights(self, seed: int | None = None) -> None:
        """Deterministic initialisation: the same seed gives the same weights on every rank."""
        generator_state = torch.random.get_rng_state()
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            self.freqs_cis = rope_frequencies(self.args.head_dim, self.args.max_seq_len,
                                              self.args.rope_theta).to(self.freqs_cis.device)
            if self.tok_embeddings is not None:
                nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=1.0 if not
                                self.args.tie_embeddings else 0.02)
            for block in self.layers.values():
                block.init_weights()
            if self.norm is not None:
                self.norm.reset_parameters()
            if self.output is not None and not self.args.tie_embeddings:
                cutoff = 3 / math.sqrt(self.args.dim)
                nn.init.trunc_normal_(self.output.weight, mean=0.0, std=self.args.dim ** -0.5,
                                      a=-cutoff, b=cutoff)
        if seed is not None:
            torch.random.set_rng_state(generator_state)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for block in self.layers.values():
            h = block(h, self.freqs_cis)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


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
