"""parallelize: activation checkpointing recomputes exactly; the order leaves the model trainable."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trainops.trainer.config import AUTO_COMPILE_MIN_STEPS, load_config
from trainops.trainer.model import Transformer, preset
from trainops.trainer.parallelize import apply_activation_checkpointing, compile_blocks


def _grads(mode: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = Transformer(preset("tiny"))
    model.init_weights(seed=0)
    apply_activation_checkpointing(model, mode)
    tokens = torch.randint(0, 256, (2, 33), generator=torch.Generator().manual_seed(1))
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    # checkpoint_wrapper adds a `_checkpoint_wrapped_module.` level to the names
    return {name.replace("_checkpoint_wrapped_module.", ""): p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_activation_checkpointing_gives_the_same_gradients(mode):
    reference, checkpointed = _grads("none"), _grads(mode)
    assert reference.keys() == checkpointed.keys()
    for name, grad in reference.items():
        assert torch.allclose(grad, checkpointed[name], atol=1e-6), name


def test_selective_checkpointing_wraps_every_other_block_and_full_wraps_all():
    def wrapped(mode: str) -> list[bool]:
        model = Transformer(preset("tiny"))
        apply_activation_checkpointing(model, mode)
        return [type(block).__name__ == "CheckpointWrapper" for block in model.layers.values()]

    assert wrapped("none") == [False] * 4
    assert wrapped("selective") == [True, False, True, False]
    assert wrapped("full") == [True] * 4


@pytest.mark.parametrize("setting, steps, compiler, compiled, said", [
    ("auto", AUTO_COMPILE_MIN_STEPS - 1, True, False, "shorter than the 1000 that pay back the compile time"),
    ("auto", AUTO_COMPILE_MIN_STEPS, True, True, "a 1000-step run pays back the compile time"),
    ("auto", AUTO_COMPILE_MIN_STEPS, False, False, "no compiler for inductor's kernels"),
    ("true", 10, False, True, "training.compile=true"),
    ("false", 5000, True, False, "training.compile=false"),
])
def test_compile_auto_compiles_long_runs_where_a_compiler_is_at_hand(monkeypatch, capsys, setting, steps, compiler,
                                                                     compiled, said):
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}" if compiler else None)
    cfg = load_config(None, "tiny", [f"training.compile={setting}", f"training.steps={steps}"])
    assert compile_blocks(cfg, "cpu") is compiled
    assert said in capsys.readouterr().out
