"""A Llama-style decoder in one file (torchtitan naming), knowing nothing of parallelism.

`tok_embeddings`, `norm` and `output` may be set to None so a pipeline stage can hold only
its slice of `layers`; `forward` then passes hidden states straight through.
"""
from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from trainops.trainer.model_args import Llama3RopeScaling, ModelArgs


def rope_frequencies(head_dim: int, seq_len: int, theta: float,
                     scaling: Llama3RopeScaling | None = None) -> torch.Tensor:
    """Complex rotations e^(i*pos*theta^(-2k/d)), shape (seq_len, head_dim // 2)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if scaling is not None:
        inv_freq = _llama3_scaled(inv_freq, scaling)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    return torch.polar(torch.ones_like(angles), angles)


def _llama3_scaled(inv_freq: torch.Tensor, scaling: Llama3RopeScaling) -> torch.Tensor:
    """The same arithmetic, in the same order, as Meta's reference and transformers' llama3 RoPE."""
    original = scaling.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = original / scaling.low_freq_factor, original / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (original / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


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
        share_kv = repeats > 1 and q.device.type == "cpu"
        if repeats > 1 and not share_kv:
            # on CUDA only the flash and math kernels take grouped K/V: copies keep every kernel eligible
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=share_kv)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: ModelArgs):
        super().__init__()
        self.layer_id = layer_id
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, args.ffn_hidden_dim)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


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
        self.register_buffer("freqs_cis", self._rope_table(), persistent=False)

    def _rope_table(self) -> torch.Tensor:
        return rope_frequencies(self.args.head_dim, self.args.max_seq_len, self.args.rope_theta,
                                self.args.rope_scaling)

    def init_rope(self) -> None:
        """(Re)compute the RoPE table on the buffer's device: after `to_empty` it holds garbage."""
        device = self.freqs_cis.device
        self.freqs_cis = self._rope_table().to(device)

    def init_weights(self, seed: int = 0) -> None:
        """Deterministic initialisation of an unsharded model (see `initial_weight`); the global
        RNG is left untouched. Sharded and meta-built models use trainops.trainer.parallelize."""
        with torch.no_grad():
            self.init_rope()
            for name, param in self.named_parameters():
                param.copy_(initial_weight(self.args, name, param.shape, seed))

    def part(self, layer_names: list[str], *, embedding: bool, head: bool) -> "Transformer":
        """A Transformer sharing (not copying) this one's modules, holding only `layer_names` and,
        when asked, the embedding and the final norm + output head: a pipeline stage's slice."""
        part = Transformer.__new__(Transformer)
        nn.Module.__init__(part)
        part.args = self.args
        part.tok_embeddings = self.tok_embeddings if embedding else None
        part.layers = nn.ModuleDict({name: self.layers[name] for name in layer_names})
        part.norm, part.output = (self.norm, self.output) if head else (None, None)
        part.register_buffer("freqs_cis", self.freqs_cis, persistent=False)
        return part

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for block in self.layers.values():
            h = block(h, self.freqs_cis)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def initial_weight(args: ModelArgs, name: str, shape: torch.Size, seed: int) -> torch.Tensor:
    """The full initial value of parameter `name` (named as in the unwrapped model), drawn from a
    generator seeded by (seed, name) alone: a parameter's value does not depend on which others a
    rank holds, so every split and sharding of the model starts from the same weights."""
    # the CPU generator (mt19937) keeps 32 bits of a seed, so both go into one 32-bit hash
    generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    value = torch.empty(shape, dtype=torch.float32)
    parts = name.split(".")
    if parts[-2].endswith("norm"):
        return value.fill_(1.0)
    if name == "tok_embeddings.weight":
        return value.normal_(0.0, 0.02 if args.tie_embeddings else 1.0, generator=generator)
    if name == "output.weight":
        cutoff = 3 / math.sqrt(args.dim)
        return nn.init.trunc_normal_(value, 0.0, args.dim ** -0.5, -cutoff, cutoff, generator=generator)
    if parts[0] == "layers" and parts[-2] in ("wq", "wk", "wv", "w1"):
        return nn.init.trunc_normal_(value, 0.0, 0.02, generator=generator)
    if parts[0] == "layers" and parts[-2] in ("wo", "w2", "w3"):
        # depth-scaled init of the residual projections keeps deep stacks stable
        return nn.init.trunc_normal_(value, 0.0, 0.02 / math.sqrt(2 * (int(parts[1]) + 1)), generator=generator)
    raise ValueError(f"no initialisation rule for parameter {name!r}: add one to initial_weight")
