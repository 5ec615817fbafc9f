"""The decoder: torchtitan names, presets, deterministic init, pipeline-stage tolerance."""
from __future__ import annotations

import torch

from trainops.trainer.model import Transformer
from trainops.trainer.model_args import PRESETS, count_parameters, preset


def _tiny(**overrides) -> Transformer:
    model = Transformer(preset("tiny", **overrides))
    model.init_weights(seed=0)
    return model


def test_module_names_follow_the_shared_contract():
    names = dict(_tiny().named_modules())
    for name in ("tok_embeddings", "layers.0.attention.wq", "layers.0.attention.wo",
                 "layers.0.feed_forward.w1", "layers.0.feed_forward.w3", "layers.0.attention_norm",
                 "layers.0.ffn_norm", "layers.3", "norm", "output"):
        assert name in names, name


def test_parameter_count_from_shapes_matches_the_built_model():
    for overrides in ({}, {"tie_embeddings": True}):
        args = preset("tiny", **overrides)
        built = sum(p.numel() for p in Transformer(args).parameters())
        assert count_parameters(args)["total"] == built


def test_planning_presets_have_the_published_llama3_sizes():
    assert abs(count_parameters(PRESETS["llama3-8b"])["total"] / 1e9 - 8.03) < 0.01
    assert abs(count_parameters(PRESETS["llama3-70b"])["total"] / 1e9 - 70.55) < 0.01


def test_same_seed_gives_the_same_weights_and_another_seed_does_not():
    a, b = _tiny(), _tiny()
    c = Transformer(preset("tiny"))
    c.init_weights(seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.layers["0"].attention.wq.weight, c.layers["0"].attention.wq.weight)


def test_tied_embeddings_share_one_tensor():
    model = _tiny(tie_embeddings=True)
    assert model.output.weight is model.tok_embeddings.weight


def test_forward_is_causal():
    model, tokens = _tiny(), torch.randint(0, 256, (1, 16))
    changed = tokens.clone()
    changed[0, 10] = (changed[0, 10] + 1) % 256
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.allclose(before[0, :10], after[0, :10], atol=1e-6)
    assert not torch.allclose(before[0, 10:], after[0, 10:])


def test_a_pipeline_stage_without_embeddings_norm_or_output_passes_hidden_states():
    model = _tiny()
    model.tok_embeddings = model.norm = model.output = None
    hidden = torch.randn(2, 8, model.args.dim)
    with torch.no_grad():
        assert model(hidden).shape == (2, 8, model.args.dim)


def test_rope_theta_changes_the_output():
    tokens = torch.randint(0, 256, (1, 32))
    with torch.no_grad():
        assert not torch.allclose(_tiny()(tokens), _tiny(rope_theta=500000.0)(tokens))
