"""Llama weights in the Hugging Face layout (`config.json` + `model.safetensors`, or shards
listed by `model.safetensors.index.json`), both ways, for transformers 4.x and 5.x configs.

So a run can start from, or hand back to, the HF ecosystem. Two differences besides names:
our RoPE rotates interleaved channel pairs (2i, 2i+1) like Meta's reference code, while HF's
`rotate_half` pairs channel i with i + head_dim/2, so the rows of `wq`/`wk` are permuted per
head on the way out and back; and tied embeddings are stored once (HF omits `lm_head`).
"""
from __future__ import annotations

import json
import warnings
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import save_file

from trainops.trainer.model import Transformer
from trainops.trainer.model_args import Llama3RopeScaling, ModelArgs

CONFIG_FILE, WEIGHTS_FILE, INDEX_FILE = "config.json", "model.safetensors", "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size, "5GB"

_LAYER_NAMES = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_TOP_NAMES = {"tok_embeddings.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


class HFFormatError(ValueError):
    """A folder or config that is not a Llama checkpoint we can read; says what is missing."""
def hf_config(args: ModelArgs) -> dict:
    """The `LlamaConfig` fields that describe `args` (what `config.json` holds). RoPE settings
    are written in both generations: `rope_parameters` (transformers 5.x) and the top-level
    `rope_theta` / `rope_scaling` that 4.x reads."""
    rope = {"rope_type": "default", "rope_theta": args.rope_theta}
    if args.rope_scaling is not None:
        rope = {"rope_type": "llama3", "rope_theta": args.rope_theta, **asdict(args.rope_scaling)}
    legacy_scaling = {k: v for k, v in rope.items() if k != "rope_theta"} if args.rope_scaling else None
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": args.dim, "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads, "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim, "intermediate_size": args.ffn_hidden_dim,
        "vocab_size": args.vocab_size, "rms_norm_eps": args.norm_eps,
        "rope_parameters": rope, "rope_theta": args.rope_theta, "rope_scaling": legacy_scaling,
        "max_position_embeddings": args.max_seq_len, "tie_word_embeddings": args.tie_embeddings,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
    }


def _rope_settings(config: dict) -> tuple[float, Llama3RopeScaling | None]:
    """RoPE theta and scaling from either generation of config.json: 5.x nests everything in
    `rope_parameters`; 4.x has a top-level `rope_theta` and an optional `rope_scaling` (whose
    type key was `type` before `rope_type`). Neither present means Llama's default theta, 10000."""
    legacy = config.get("rope_scaling") or {}
    settings = {**legacy, **(config.get("rope_parameters") or {})}
    theta = settings.get("rope_theta", config.get("rope_theta", 10000.0))
    rope_type = settings.get("rope_type", settings.get("type", "default"))
    if settings.get("partial_rotary_factor", 1.0) != 1.0:
        raise HFFormatError(f"config.json partial_rotary_factor={settings['partial_rotary_factor']} is not "
                            "supported: our RoPE rotates the whole head")
    if rope_type == "default":
        return float(theta), None
    if rope_type != "llama3":
        raise HFFormatError(f"config.json rope_type={rope_type!r} is not supported: only 'default' and 'llama3' "
                            "RoPE are implemented")
    needed = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in needed if k not in settings]
    if missing:
        raise HFFormatError(f"config.json rope_type='llama3' lacks {missing}: add them to rope_parameters "
                            "(or rope_scaling)")
    return float(theta), Llama3RopeScaling(
        factor=float(settings["factor"]), low_freq_factor=float(settings["low_freq_factor"]),
        high_freq_factor=float(settings["high_freq_factor"]),
        original_max_position_embeddings=int(settings["original_max_position_embeddings"]))


def args_from_hf_config(config: dict) -> ModelArgs:
    """`ModelArgs` from a Llama `config.json` of transformers 4.x or 5.x; rejects what our model
    cannot represent, by name, rather than building a different model silently."""
    if config.get("model_type", "llama") != "llama":
        raise HFFormatError(f"config.json model_type={config.get('model_type')!r} is not 'llama': only "
                            "Llama-architecture checkpoints are supported")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise HFFormatError("config.json attention_bias/mlp_bias=true is not supported: our linears have no bias")
    if config.get("hidden_act", "silu") != "silu":
        raise HFFormatError(f"config.json hidden_act={config['hidden_act']!r} is not supported: our feed-forward "
                            "is SwiGLU (silu)")
    dim, heads = config["hidden_size"], config["num_attention_heads"]
    if (config.get("head_dim") or dim // heads) != dim // heads:
        raise HFFormatError(f"config.json head_dim={config['head_dim']} differs from "
                            f"hidden_size/num_attention_heads = {dim // heads}: not supported")
    theta, scaling = _rope_settings(config)
    return ModelArgs(
        dim=dim, n_layers=config["num_hidden_layers"], n_heads=heads,
        n_kv_heads=config.get("num_key_value_heads") or heads, vocab_size=config["vocab_size"],
        ffn_hidden_dim=config["intermediate_size"], norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=theta, rope_scaling=scaling, max_seq_len=config.get("max_position_embeddings", 2048),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


def read_hf_config(folder: str | Path) -> ModelArgs:
    """`ModelArgs` of an HF folder's config.json."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        raise HFFormatError(f"{folder} has no {CONFIG_FILE}: point at a Hugging Face Llama model folder")
    return args_from_hf_config(json.loads(path.read_text()))


def _interleaved_to_half(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    rows, cols = weight.shape
    return weight.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _half_to_interleaved(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    rows, cols = weight.shape
    return weight.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def _rename(ours: str) -> str:
    if ours in _TOP_NAMES:
        return _TOP_NAMES[ours]
    _, index, rest = ours.split(".", 2)
    return f"model.layers.{index}.{_LAYER_NAMES[rest]}"


def to_hf_state_dict(state_dict: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Our full (unsharded) state dict -> HF names and RoPE layout."""
    out = {}
    for name, tensor in state_dict.items():
        if name == "output.weight" and args.tie_embeddings:
            continue
        tensor = tensor.detach()
        if name.endswith("attention.wq.weight"):
            tensor = _interleaved_to_half(tensor, args.n_heads)
        elif name.endswith("attention.wk.weight"):
            tensor = _interleaved_to_half(tensor, args.kv_heads)
        out[_rename(name)] = tensor.contiguous()
    return out


def _hf_source(name: str, args: ModelArgs) -> str:
    """The HF tensor our parameter `name` is read from (a tied head reads the embedding)."""
    if name == "output.weight" and args.tie_embeddings:
        return _TOP_NAMES["tok_embeddings.weight"]
    return _rename(name)


def _to_ours(name: str, tensor: torch.Tensor, args: ModelArgs) -> torch.Tensor:
    if name.endswith("attention.wq.weight"):
        return _half_to_interleaved(tensor, args.n_heads)
    if name.endswith("attention.wk.weight"):
        return _half_to_interleaved(tensor, args.kv_heads)
    return tensor


class HFCheckpoint:
    """An HF Llama folder opened for reading one tensor at a time: a single `model.safetensors`,
    or shards listed by `model.safetensors.index.json` (the layout of every big checkpoint). A
    rank of a sharded run reads only the tensors its parameters need."""
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.args = read_hf_config(self.folder)
        index = self.folder / INDEX_FILE
        if index.is_file():
            self.weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        elif (self.folder / WEIGHTS_FILE).is_file():
            with safe_open(str(self.folder / WEIGHTS_FILE), "pt") as handle:
                self.weight_map = {key: WEIGHTS_FILE for key in handle.keys()}
        else:
            raise HFFormatError(f"{self.folder} has neither {WEIGHTS_FILE} nor {INDEX_FILE}: convert .bin weights "
                                "with transformers' save_pretrained(safe_serialization=True)")

    def tensor(self, name: str, shape: torch.Size | None = None) -> torch.Tensor:
        """Our parameter `name` as a full fp32 tensor in our layout; `shape`, when given, is checked."""
        hf_name = _hf_source(name, self.args)
        if hf_name not in self.weight_map:
            raise HFFormatError(f"{self.folder} has no tensor {hf_name!r} (needed for {name}): is this a Llama "
                                f"checkpoint with {self.args.n_layers} layers?")
        shard = self.folder / self.weight_map[hf_name]
        if not shard.is_file():
            raise HFFormatError(f"{INDEX_FILE} maps {hf_name!r} to {shard.name}, which is missing from {self.folder}")
        with safe_open(str(shard), "pt") as handle:
            value = _to_ours(name, handle.get_tensor(hf_name), self.args).to(torch.float32)
        if shape is not None and tuple(value.shape) != tuple(shape):
            raise HFFormatError(f"{hf_name} in {shard.name} has shape {tuple(value.shape)}, the model expects "
                                f"{tuple(shape)}: config.json and the weights disagree")
        return value


def _shards(tensors: dict[str, torch.Tensor], max_shard_bytes: int) -> list[dict[str, torch.Tensor]]:
    """Tensors in order, cut into groups of at most `max_shard_bytes` (a bigger tensor alone)."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def export_hf(model: Transformer, folder: str | Path, dtype: torch.dtype = torch.float32,
              max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> Path:
    """Write `config.json` and the weights of `model` (full, unsharded): `model.safetensors`
    when they fit in `max_shard_bytes`, else numbered shards and `model.safetensors.index.json`,
    as transformers' `save_pretrained` does."""
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes={max_shard_bytes} must be positive (bytes per safetensors file)")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = hf_config(model.args) | {"torch_dtype": str(dtype).removeprefix("torch.")}
    tensors = {k: v.to(dtype) for k, v in to_hf_state_dict(model.state_dict(), model.args).items()}
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    else:
        weight_map = {}
        for number, shard in enumerate(shards, start=1):
            name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(folder / name), metadata={"format": "pt"})
            weight_map |= {key: name for key in shard}
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                                    indent=2) + "\n")
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return folder


def checkpoint_to_hf(checkpoint: str | Path, args: ModelArgs, folder: str | Path,
                     max_shard_bytes: int = DEFAULT_SHARD_BYTES) -> Path:
    """Export a committed DCP checkpoint (any layout: FSDP2, TP, PP shards) as an HF folder, in
    one process: DCP reassembles the full tensors from the shards on load."""
    model = Transformer(args)
    state = {"app": {"model": model.state_dict()}}
    with warnings.catch_warnings():  # one process on purpose: DCP warns that no process group exists
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    model.load_state_dict(state["app"]["model"])
    return export_hf(model, folder, max_shard_bytes=max_shard_bytes)
