"""The loader: deterministic, sharded by data-parallel rank, resumable from its position."""
from __future__ import annotations

import pytest
import torch

from trainops.trainer.config import DataConfig
from trainops.trainer.data import DataLoader


def _loader(kind: str = "text", **kwargs) -> DataLoader:
    settings = dict(vocab_size=256, seq_len=32, seed=0, global_batch=8, micro_batch=2)
    return DataLoader(DataConfig(kind=kind), **{**settings, **kwargs})


def _step_inputs(loader: DataLoader) -> torch.Tensor:
    return torch.cat([inputs for inputs, _ in loader.next_step()])


@pytest.mark.parametrize("kind", ["text", "synthetic"])
def test_data_parallel_ranks_together_see_the_single_process_global_batch(kind):
    single = _loader(kind)
    ranks = [_loader(kind, dp_rank=r, dp_degree=2) for r in range(2)]
    for _ in range(3):
        assert torch.equal(_step_inputs(single), torch.cat([_step_inputs(rank) for rank in ranks]))


def test_labels_are_the_inputs_shifted_by_one():
    inputs, labels = _loader().next_step()[0]
    assert torch.equal(inputs[:, 1:], labels[:, :-1])


def test_accumulation_splits_a_rank_share_into_micro_batches():
    micro_batches = _loader(dp_rank=1, dp_degree=2).next_step()
    assert len(micro_batches) == 2 and micro_batches[0][0].shape == (2, 32)


def test_resuming_from_state_dict_continues_with_the_same_batches():
    straight = _loader()
    for _ in range(2):
        straight.next_step()
    resumed = _loader()
    resumed.load_state_dict(straight.state_dict())
    assert torch.equal(_step_inputs(resumed), _step_inputs(straight))


def test_resuming_with_another_global_batch_is_refused():
    state = _loader().state_dict()
    with pytest.raises(ValueError, match="same global batch"):
        _loader(global_batch=16).load_state_dict(state)


def test_text_tokens_are_the_bytes_of_the_file(tmp_path):
    text = tmp_path / "t.txt"
    text.write_bytes(bytes(range(65, 91)) * 4)
    loader = DataLoader(DataConfig(kind="text", path=str(text)), vocab_size=256, seq_len=8, seed=0,
                        global_batch=1, micro_batch=1)
    inputs, _ = loader.next_step()[0]
    assert bytes(inputs[0].tolist()) in text.read_bytes()


def test_a_text_shorter_than_one_sequence_is_rejected_with_the_fix(tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("too short")
    with pytest.raises(ValueError, match="needs at least seq_len\\+1"):
        DataLoader(DataConfig(kind="text", path=str(text)), vocab_size=256, seq_len=32, seed=0,
                   global_batch=1, micro_batch=1)


def test_a_global_batch_not_divisible_by_the_data_parallel_slices_is_rejected():
    with pytest.raises(ValueError, match=r"global_batch \(8\) must be a multiple of data-parallel degree \(3\)"):
        _loader(dp_degree=3)


def test_time_spent_producing_data_is_measured_and_reset():
    loader = _loader()
    loader.next_step()
    assert loader.pop_data_wait_s() > 0 and loader.pop_data_wait_s() == 0
