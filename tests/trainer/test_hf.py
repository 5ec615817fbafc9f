"""HF interop: transformers' own LlamaForCausalLM (built from a config, no download) and our
Transformer give the same logits after export and after import.

Tolerance: atol 1e-4 on fp32 logits of magnitude ~1: both sides run the same fp32 math in a
different order (complex-multiply RoPE vs rotate_half, SDPA vs eager attention), which moves
the last bits (measured max difference 4e-7); leaving out the RoPE row permutation moves
them by 2.8e-3 (measured), 28x the tolerance."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

from tests.trainer.hf_import import import_hf
from trainops.trainer.checkpoint import AppState, Checkpointer
from trainops.trainer.config import load_config
from trainops.trainer.hf import HFFormatError, args_from_hf_config, checkpoint_to_hf, export_hf, hf_config
from trainops.trainer.model import Transformer
from trainops.trainer.model_args import PRESETS

ATOL = 1e-4


def _hf_model(args):
    config = LlamaConfig(**{k: v for k,
                            v in hf_config(args).items() if k not in ("architectures", "model_type", "torch_dtype")},
                         attn_implementation="eager")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def _ours(args, seed=0):
    model = Transformer(args)
    model.init_weights(seed=seed)
    return model.eval()


TOKENS = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("tie", [False, True])
def test_exported_weights_give_hf_the_same_logits(tmp_path, tie):
    args = PRESETS["tiny"].__class__(**{**PRESETS["tiny"].__dict__, "tie_embeddings": tie})
    ours = _ours(args)
    export_hf(ours, tmp_path / "hf")
    theirs = LlamaForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(TOKENS).logits, ours(TOKENS), atol=ATOL, rtol=0)


def test_imported_hf_weights_give_our_model_the_same_logits(tmp_path):
    args = PRESETS["tiny"]
    theirs = _hf_model(args)
    theirs.save_pretrained(tmp_path / "hf", safe_serialization=True)
    ours = import_hf(tmp_path / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(TOKENS), theirs(TOKENS).logits, atol=ATOL, rtol=0)


def test_round_trip_is_bit_exact(tmp_path):
    ours = _ours(PRESETS["tiny"], seed=3)
    back = import_hf(export_hf(ours, tmp_path / "hf"))
    for (name, a), (_, b) in zip(ours.state_dict().items(), back.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-1b"])
def test_config_round_trips(name):
    args = PRESETS[name]
    assert args_from_hf_config(hf_config(args)) == args


@pytest.mark.parametrize("rope_type", ["linear", "dynamic", "yarn", "longrope"])
def test_a_rope_type_we_do_not_implement_is_refused_by_name(rope_type):
    config = hf_config(PRESETS["tiny"]) | {"rope_parameters": {"rope_type": rope_type, "rope_theta": 1e4,
                                                               "factor": 2.0}}
    with pytest.raises(HFFormatError, match=rf"rope_type='{rope_type}' is not supported"):
        args_from_hf_config(config)


def test_a_legacy_rope_scaling_of_another_type_is_refused_by_name():
    config = hf_config(PRESETS["tiny"])
    del config["rope_parameters"]
    config["rope_scaling"] = {"type": "linear", "factor": 2.0}
    with pytest.raises(HFFormatError, match=r"rope_type='linear' is not supported"):
        args_from_hf_config(config)


def test_llama3_scaling_without_its_factors_names_what_is_missing():
    config = hf_config(PRESETS["tiny"]) | {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}}
    with pytest.raises(HFFormatError,
                       match=r"lacks \['low_freq_factor', 'high_freq_factor', 'original_max_position_embeddings'\]"):
        args_from_hf_config(config)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(HFFormatError, match=r"has no config.json"):
        import_hf(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    folder = export_hf(_ours(PRESETS["tiny"]), tmp_path / "hf")
    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.3.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(HFFormatError, match=r"model.layers.3.mlp.up_proj.weight"):
        import_hf(folder)
    assert json.loads((folder / "config.json").read_text())["num_hidden_layers"] == 4


def test_a_training_checkpoint_exports_to_hf_with_the_same_logits(tmp_path):
    cfg = load_config(None, "tiny", ["checkpoint.enable=true"])
    ours = _ours(cfg.model_args(), seed=5)
    optimizer = torch.optim.SGD(ours.parameters(), lr=0.1)
    saver = Checkpointer(cfg.checkpoint, tmp_path / "run", rank=0)
    saver.save(7, AppState(ours, optimizer))
    saver.close()
    folder = checkpoint_to_hf(tmp_path / "run" / "checkpoints" / "step-00000007", cfg.model_args(), tmp_path / "hf")
    theirs = LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(TOKENS).logits, ours(TOKENS), atol=ATOL, rtol=0)
