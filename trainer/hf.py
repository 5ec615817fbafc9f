"""Llama weights in the Hugging Face layout (`config.json` + `model.safetensors`), both ways.

So a run can start from, or hand back to, the HF ecosystem. Two differences besides names:
our RoPE rotates interleaved channel pairs (2i, 2i+1) like Meta's reference code, while HF's
`rotate_half` pairs channel i with i + head_dim/2, so the rows of `wq`/`wk` are permuted per
head on the way out and back; and tied embeddings are stored once (HF omits `lm_head`).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from trainops.trainer.model import ModelArgs, Transformer

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"

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
    """The `LlamaConfig` fields that describe `args` (what `config.json` holds)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": args.dim, "num_hidden_layers": args.n_layers,
        "num_attention_heads": args.n_heads, "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim, "intermediate_size": args.ffn_hidden_dim,
        "vocab_size": args.vocab_size, "rms_norm_eps": args.norm_eps, "rope_theta": args.rope_theta,
        "max_position_embeddings": args.max_seq_len, "tie_word_embeddings": args.tie_embeddings,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
    }


def args_from_hf_config(config: dict) -> ModelArgs:
    """`ModelArgs` from a Llama `config.json`; rejects what our model cannot represent."""
    if config.get("model_type", "llama") != "llama":
        raise HFFormatError(f"config.json model_type={config.get('model_type')!r} is not 'llama': only Llama-architecture checkpoints are supported")
    if config.get("rope_scaling"):
        raise HFFormatError(f"config.json rope_scaling={config['rope_scaling']!r} is not supported: our RoPE is unscaled; use a checkpoint without rope_scaling")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise HFFormatError("config.json attention_bias/mlp_bias=true is not supported: our linears have no bias")
    dim, heads = config["hidden_size"], config["num_attention_heads"]
    if config.get("head_dim", dim // heads) != dim // heads:
        raise HFFormatError(f"config.json head_dim={config['head_dim']} differs from hidden_size/num_attention_heads = {dim // heads}: not supported")
    return ModelArgs(
        dim=dim, n_layers=config["num_hidden_layers"], n_heads=heads,
        n_kv_heads=config.get("num_key_value_heads", heads), vocab_size=config["vocab_size"],
        ffn_hidden_dim=config["intermediate_size"], norm_eps=config.get("rms_norm_eps", 1e-5),
        rope_theta=config.get("rope_theta", 10000.0), max_seq_len=config.get("max_position_embeddings", 2048),
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
    )


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


def from_hf_state_dict(hf_state: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """HF names and RoPE layout -> our state dict (every key of `Transformer(args)`)."""
    out = {}
    for name in _our_keys(args):
        hf_name = _rename(name)
        if name == "output.weight" and args.tie_embeddings:
            hf_name = _TOP_NAMES["tok_embeddings.weight"]
        if hf_name not in hf_state:
            raise HFFormatError(f"weights file has no tensor {hf_name!r} (needed for {name}): is this a Llama checkpoint with {args.n_layers} layers?")
        tensor = hf_state[hf_name]
        if name.endswith("attention.wq.weight"):
            tensor = _half_to_interleaved(tensor, args.n_heads)
        elif name.endswith("attention.wk.weight"):
            tensor = _half_to_interleaved(tensor, args.kv_heads)
        out[name] = tensor
    return out


def _our_keys(args: ModelArgs) -> list[str]:
    keys = ["tok_embeddings.weight"]
    for i in range(args.n_layers):
        keys += [f"layers.{i}.{rest}" for rest in _LAYER_NAMES]
    return keys + ["norm.weight", "output.weight"]


def export_hf(model: Transformer, folder: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write `config.json` and `model.safetensors` for `model` (full weights, rank 0's job)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = hf_config(model.args) | {"torch_dtype": str(dtype).removeprefix("torch.")}
    tensors = {k: v.to(dtype) for k, v in to_hf_state_dict(model.state_dict(), model.args).items()}
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return folder


def import_hf(folder: str | Path) -> Transformer:
    """Build an fp32 `Transformer` from an HF Llama folder (one or several safetensors files).

    fp32 because these become master weights; mixed precision casts per op. (Casting the
    module with `.to(dtype)` would also drop the imaginary part of the complex RoPE buffer.)"""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / CONFIG_FILE).is_file():
        raise HFFormatError(f"{folder} has no {CONFIG_FILE}: point at a Hugging Face Llama model folder")
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise HFFormatError(f"{folder} has no *.safetensors weights: convert .bin weights with transformers' save_pretrained(safe_serialization=True)")
    args = args_from_hf_config(json.loads((folder / CONFIG_FILE).read_text()))
    hf_state: dict[str, torch.Tensor] = {}
    for shard in shards:
        hf_state.update(load_file(str(shard)))
    model = Transformer(args)
    weights = from_hf_state_dict(hf_state, args)
    model.load_state_dict({k: v.to(torch.float32) for k, v in weights.items()}, strict=True)
    return model


def checkpoint_to_hf(checkpoint: str | Path, args: ModelArgs, folder: str | Path) -> Path:
    """Export a committed DCP checkpoint (any layout: FSDP2, TP, PP shards) as an HF folder, in
    one process: DCP reassembles the full tensors from the shards on load."""
    import torch.distributed.checkpoint as dcp

    model = Transformer(args)
    state = {"app": {"model": model.state_dict()}}
    dcp.load(state, checkpoint_id=str(checkpoint), no_dist=True)
    model.load_state_dict(state["app"]["model"])
    return export_hf(model, folder)
