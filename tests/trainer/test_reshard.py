"""Checkpoint resharding: save under one layout after 2 of 4 steps, load under another, and
steps 3-4 give the one-process losses (same tolerance and reasoning as test_parallel.py).
Model weights and the SGD momentum buffers are both resharded by DCP on load."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from trainops.trainer.hf import checkpoint_to_hf

sys.path.insert(0, str(Path(__file__).parent))
import parallel_worker  # noqa: E402

ATOL = 1e-4  # see test_parallel.py


@pytest.fixture(scope="module")
def expected() -> list[float]:
    return parallel_worker.reference_losses()


@pytest.fixture(scope="module")
def resumed(tmp_path_factory) -> dict:
    """One 4-process save, then one 2-process launch that saves and loads across layouts."""
    root = tmp_path_factory.mktemp("reshard")
    four = parallel_worker.launch(root, 4, [f"fsdp2_tp2:save={root}/from4@2"])
    two = parallel_worker.launch(root, 2, [
        f"fsdp2:load={root}/from4",
        f"fsdp2:save={root}/fsdp@2", f"tp2:load={root}/fsdp",
        f"pp2_1F1B:save={root}/pp@2", f"fsdp2:load={root}/pp",
        f"pp2_ZBVZeroBubble:save={root}/zbv@2", f"tp2_sp:load={root}/zbv",
    ])
    return {"root": root, "4->2": two[f"fsdp2:load={root}/from4"], "saved4": four[f"fsdp2_tp2:save={root}/from4@2"],
            "fsdp2->tp2": two[f"tp2:load={root}/fsdp"], "pp2->fsdp2": two[f"fsdp2:load={root}/pp"],
            "zbv->tp2_sp": two[f"tp2_sp:load={root}/zbv"]}


@pytest.mark.slow
@pytest.mark.parametrize("change", ["fsdp2->tp2", "pp2->fsdp2", "4->2", "zbv->tp2_sp"])
def test_training_continues_with_the_same_loss_under_a_new_layout(resumed, expected, change):
    losses = resumed[change]
    assert losses[:2] == [None, None]  # steps 1-2 came from the checkpoint
    assert losses[2:] == pytest.approx(expected[2:], abs=ATOL)


@pytest.mark.slow
def test_saving_does_not_disturb_the_saving_run(resumed, expected):
    assert resumed["saved4"] == pytest.approx(expected, abs=ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("saved", ["from4", "pp"], ids=["fsdp2xtp2-4proc", "pp2"])
def test_a_sharded_checkpoint_exports_to_hf_as_the_one_process_model(resumed, saved):
    """DCP reassembles FSDP2/TP/PP shards into full HF tensors; HF's model then gives the
    logits of the one-process model after the same 2 steps (atol 1e-4, as in test_hf.py)."""
    reference, _ = parallel_worker.reference_run(2)
    checkpoint = resumed["root"] / saved / "checkpoints" / "step-00000002"
    folder = checkpoint_to_hf(checkpoint, reference.args, resumed["root"] / f"hf-{saved}")
    theirs = LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        torch.testing.assert_close(theirs(tokens).logits, reference.eval()(tokens), atol=1e-4, rtol=0)
