"""Checkpoints as the installed transformers writes them: its own LlamaConfig and
LlamaForCausalLM, saved with save_pretrained (5.x `rope_parameters`, rewritten to the 4.x
top-level `rope_theta` / `rope_scaling` for the older generation), Llama 3.1/3.2 RoPE scaling,
and checkpoints split over several safetensors shards. Logits agree within 1e-4 both ways
(import: their weights in our model; export: our weights in theirs); see test_hf.py for why
that tolerance."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM

from tests.trainer.hf_import import import_hf
from trainops.trainer.hf import INDEX_FILE, WEIGHTS_FILE, HFFormatError, args_from_hf_config, export_hf
from trainops.trainer.model import Transformer
from trainops.trainer.model_args import PRESETS, Llama3RopeScaling, ModelArgs

ATOL = 1e-4
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32}
# (heads, kv heads): GQA ratios 1, 3 and 8; tied and untied; three thetas; two epsilons
SHAPES = [
    dict(heads=4, kv=4, tie=False, theta=10000.0, eps=1e-5),
    dict(heads=6, kv=2, tie=True, theta=500000.0, eps=1e-6),
    dict(heads=8, kv=1, tie=False, theta=1e6, eps=1e-5),
    dict(heads=8, kv=1, tie=True, theta=10000.0, eps=1e-6),
    dict(heads=6, kv=2, tie=False, theta=1e6, eps=1e-6),
    dict(heads=4, kv=4, tie=True, theta=500000.0, eps=1e-5),
]
SEQ = 96  # past the scaled checkpoints' original 32 positions


def _config(shape: dict, scaling: dict | None = None):
    rope = {"rope_type": "default", "rope_theta": shape["theta"]} | (scaling or {})
    return LlamaConfig(hidden_size=16 * shape["heads"], num_hidden_layers=2, num_attention_heads=shape["heads"],
                       num_key_value_heads=shape["kv"], intermediate_size=96, vocab_size=256,
                       rms_norm_eps=shape["eps"], rope_parameters=rope, tie_word_embeddings=shape["tie"],
                       max_position_embeddings=128)


def _their_model(config, seed: int = 0):
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # HF's init leaves norms at 1; move them so a mis-mapped norm shows
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model


def _tokens() -> torch.Tensor:
    return torch.randint(0, 256, (2, SEQ), generator=torch.Generator().manual_seed(1))


def _assert_same_logits(ours, theirs) -> None:
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), theirs(tokens).logits, atol=ATOL, rtol=0)


def _to_4x(folder) -> None:
    """Rewrite a 5.x config.json the way transformers 4.x wrote it."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    rope = config.pop("rope_parameters")
    config["rope_theta"] = rope.pop("rope_theta")
    config["rope_scaling"] = rope if rope["rope_type"] != "default" else None
    path.write_text(json.dumps(config))


def _shape_id(shape: dict) -> str:
    tie = "tied" if shape["tie"] else "untied"
    return f"gqa{shape['heads'] // shape['kv']}-{tie}-theta{shape['theta']:g}-eps{shape['eps']:g}"


@pytest.mark.parametrize("generation", ["5.x", "4.x"])
@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
def test_a_checkpoint_saved_by_transformers_imports_with_its_logits(tmp_path, shape, generation):
    theirs = _their_model(_config(shape))
    theirs.save_pretrained(tmp_path / "hf")
    if generation == "4.x":
        _to_4x(tmp_path / "hf")
    ours = import_hf(tmp_path / "hf").eval()
    assert ours.args.rope_theta == shape["theta"] and ours.args.norm_eps == shape["eps"]
    _assert_same_logits(ours, theirs)


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
def test_an_exported_model_loads_in_transformers_with_our_logits(tmp_path, shape):
    args = ModelArgs(dim=16 * shape["heads"], n_layers=2, n_heads=shape["heads"], n_kv_heads=shape["kv"],
                     vocab_size=256, ffn_hidden_dim=96, norm_eps=shape["eps"], rope_theta=shape["theta"],
                     max_seq_len=128, tie_embeddings=shape["tie"])
    ours = Transformer(args)
    ours.init_weights(seed=2)
    theirs = LlamaForCausalLM.from_pretrained(export_hf(ours, tmp_path / "hf"), attn_implementation="eager").eval()
    assert theirs.config.rope_parameters["rope_theta"] == shape["theta"]
    _assert_same_logits(ours.eval(), theirs)


@pytest.mark.parametrize("generation", ["5.x", "4.x"])
def test_llama3_rope_scaling_imports_with_its_logits(tmp_path, generation):
    theirs = _their_model(_config(SHAPES[1], LLAMA3_SCALING))
    theirs.save_pretrained(tmp_path / "hf")
    if generation == "4.x":
        _to_4x(tmp_path / "hf")
    ours = import_hf(tmp_path / "hf").eval()
    assert ours.args.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 32)
    _assert_same_logits(ours, theirs)


def test_llama3_rope_scaling_exports_with_its_logits(tmp_path):
    args = args_from_hf_config(_config(SHAPES[0], LLAMA3_SCALING).to_dict())
    ours = Transformer(args)
    ours.init_weights(seed=4)
    theirs = LlamaForCausalLM.from_pretrained(export_hf(ours, tmp_path / "hf"), attn_implementation="eager").eval()
    assert theirs.config.rope_parameters["rope_type"] == "llama3"
    _assert_same_logits(ours.eval(), theirs)


def test_llama3_scaling_changes_the_logits_so_the_test_above_can_fail(tmp_path):
    theirs = _their_model(_config(SHAPES[1], LLAMA3_SCALING))
    theirs.save_pretrained(tmp_path / "hf")
    unscaled = import_hf(tmp_path / "hf")
    unscaled.args.rope_scaling = None
    unscaled.init_rope()
    tokens = _tokens()
    with torch.no_grad():
        assert (unscaled.eval()(tokens) - theirs(tokens).logits).abs().max() > 100 * ATOL


def test_an_imported_llama3_checkpoint_trains(tmp_path):
    _their_model(_config(SHAPES[1], LLAMA3_SCALING)).save_pretrained(tmp_path / "hf")
    model = import_hf(tmp_path / "hf")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    tokens = _tokens()
    losses = []
    for _ in range(8):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.5


def test_the_llama3_1b_preset_carries_the_published_3_2_scaling():
    args = PRESETS["llama3-1b"]
    assert args.rope_theta == 500000.0
    assert args.rope_scaling == Llama3RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                                  original_max_position_embeddings=8192)


def test_a_checkpoint_sharded_by_transformers_imports_through_its_index(tmp_path):
    theirs = _their_model(_config(SHAPES[2]))
    theirs.save_pretrained(tmp_path / "hf", max_shard_size="100KB")
    assert (tmp_path / "hf" / INDEX_FILE).is_file() and len(list((tmp_path / "hf").glob("*.safetensors"))) > 2
    _assert_same_logits(import_hf(tmp_path / "hf").eval(), theirs)


def test_export_writes_shards_of_the_asked_size_with_an_index_transformers_loads(tmp_path):
    ours = Transformer(PRESETS["tiny"])
    ours.init_weights(seed=5)
    folder = export_hf(ours, tmp_path / "hf", max_shard_bytes=1_000_000)
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    index = json.loads((folder / INDEX_FILE).read_text())
    assert len(shards) >= 4 and not (folder / WEIGHTS_FILE).exists()
    assert set(index["weight_map"].values()) == {shard.name for shard in shards}
    # a shard exceeds the limit only when it holds one tensor bigger than the limit

    for shard in shards:
        with safe_open(str(shard), "pt") as handle:
            keys = list(handle.keys())
        assert shard.stat().st_size <= 1_000_000 + 10_000 or len(keys) == 1
    back = import_hf(folder)
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), back.state_dict().values(), strict=True))
    theirs = LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        tokens = _tokens()[:, :64]
        torch.testing.assert_close(theirs(tokens).logits, ours.eval()(tokens), atol=ATOL, rtol=0)


def test_an_index_naming_a_missing_shard_says_which(tmp_path):
    ours = Transformer(PRESETS["tiny"])
    ours.init_weights(seed=5)
    folder = export_hf(ours, tmp_path / "hf", max_shard_bytes=1_000_000)
    missing = sorted(folder.glob("model-*.safetensors"))[1]
    missing.unlink()
    with pytest.raises(HFFormatError, match=rf"to {missing.name}, which is missing"):
        import_hf(folder)
