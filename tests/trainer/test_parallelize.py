"""parallelize: activation checkpointing recomputes exactly; the order leaves the model trainable."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from trainops.trainer.config import AUTO_COMPILE_MIN_STEPS, load_config
from trainops.trainer.model import Transformer
from trainops.trainer.model_args import preset
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


@pytest.mark.parametrize("setting, steps, problem, compiled, said", [
    ("auto", AUTO_COMPILE_MIN_STEPS - 1, None, False, "shorter than the 1000 that pay back the compile time"),
    ("auto", AUTO_COMPILE_MIN_STEPS, None, True, "a 1000-step run pays back the compile time"),
    ("auto", AUTO_COMPILE_MIN_STEPS, "CalledProcessError: g++ failed", False,
     "inductor cannot build kernels here (CalledProcessError: g++ failed)"),
    ("true", 10, "CalledProcessError: g++ failed", True, "training.compile=true"),
    ("false", 5000, None, False, "training.compile=false"),
])
def test_compile_auto_compiles_long_runs_where_inductor_can_build_kernels(monkeypatch, capsys, setting, steps,
                                                                          problem, compiled, said):
    monkeypatch.setattr("trainops.trainer.parallelize.compile_problem", lambda device_type: problem)
    cfg = load_config(None, "tiny", [f"training.compile={setting}", f"training.steps={steps}"])
    assert compile_blocks(cfg, "cpu") is compiled
    assert said in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("cxx, works", [("g++", True), ("/bin/false", False)], ids=["g++", "a broken compiler"])
def test_the_compile_probe_builds_a_real_kernel(tmp_path, cxx, works):
    """In a fresh process with an empty inductor cache: a compiler that fails is found before a
    long run depends on it."""
    probe = "from trainops.trainer.parallelize import compile_problem; print(repr(compile_problem('cpu')))"
    env = {**os.environ, "CXX": cxx, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = done.stdout.strip().splitlines()[-1]
    assert (said == "None") is works, said
