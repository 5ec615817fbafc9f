"""Checkpoints in one process: exact resume, atomic commit, keep-N, verification and fallback.

The model, data loader and config are the real trainer pieces (tiny preset cut to 2 layers,
seq_len 32) so a step costs milliseconds; the multi-process cases are in
test_checkpoint_distributed.py.
"""
from __future__ import annotations

import json
import logging
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainops.trainer.checkpoint import AppState, Checkpointer
from trainops.trainer.checkpoint_files import COMMIT_FILE, list_checkpoints, step_dir_name, verify_checkpoint
from trainops.trainer.config import CheckpointConfig, load_config
from trainops.trainer.data import DataLoader
from trainops.trainer.faults import corrupt_checkpoint
from trainops.trainer.model import Transformer

MODES = ["sync", "async", "async_pinned"]


@dataclass
class Job:
    model: Transformer
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: DataLoader

    def app(self) -> AppState:
        return AppState(self.model, self.optimizer, self.scheduler, self.loader)

    def train(self, steps: int) -> list[float]:
        losses = []
        for _ in range(steps):
            micro_batches = self.loader.next_step()
            total = 0.0
            for inputs, labels in micro_batches:
                logits = self.model(inputs)
                loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten()) / len(micro_batches)
                loss.backward()
                total += loss.item()
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad()
            losses.append(total)
        return losses


def make_job(weights_seed: int = 0) -> Job:
    cfg = load_config(preset="tiny", overrides=[
        "model.n_layers=2", "training.seq_len=32", "training.global_batch=4",
        "training.micro_batch=2", "data.kind=synthetic",
    ])
    model = Transformer(cfg.model_args())
    model.init_weights(weights_seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3))
    loader = DataLoader(cfg.data, vocab_size=256, seq_len=32, seed=0, global_batch=4, micro_batch=2)
    return Job(model, optimizer, scheduler, loader)


def ckpt_cfg(**changes) -> CheckpointConfig:
    return CheckpointConfig(**{"enable": True, "interval": 2, "mode": "sync", "keep": 3, **changes})


def journal(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "checkpoints.jsonl").read_text().splitlines()]


def saved_run(run_dir: Path, steps: int, **changes) -> Job:
    """Train `steps` steps, checkpointing on the interval; returns the trained job."""
    job = make_job()
    checkpointer = Checkpointer(ckpt_cfg(**changes), run_dir, rank=0)
    app = job.app()
    for step in range(1, steps + 1):
        job.train(1)
        checkpointer.maybe_save(step, app)
    checkpointer.close()
    return job


@pytest.mark.parametrize("mode", MODES)
def test_resume_reproduces_the_uninterrupted_losses_bit_exactly(tmp_path, mode):
    straight = make_job().train(8)

    first = make_job()
    checkpointer = Checkpointer(ckpt_cfg(mode=mode, interval=4), tmp_path, rank=0)
    app = first.app()
    before = first.train(4)
    checkpointer.maybe_save(4, app)
    checkpointer.close()

    resumed = make_job(weights_seed=1)  # other weights, fresh optimizer and loader: all must come from disk
    checkpointer = Checkpointer(ckpt_cfg(mode=mode, interval=4), tmp_path, rank=0)
    assert checkpointer.load_latest(resumed.app()) == 4
    after = resumed.train(4)
    checkpointer.close()

    assert before + after == straight


def test_resume_restores_python_and_torch_rng(tmp_path):
    job = make_job()
    checkpointer = Checkpointer(ckpt_cfg(), tmp_path, rank=0)
    checkpointer.save(2, job.app())
    expected = (random.random(), torch.rand(3).tolist())

    random.seed(123)
    torch.manual_seed(123)
    checkpointer.load_latest(make_job().app())
    assert (random.random(), torch.rand(3).tolist()) == expected


@pytest.mark.parametrize("mode", MODES)
def test_commit_lists_every_file_with_size_and_sha256_and_leaves_no_tmp(tmp_path, mode):
    saved_run(tmp_path, 2, mode=mode)
    folder = tmp_path / "checkpoints"
    assert [p.name for p in folder.iterdir()] == [step_dir_name(2)]
    commit = json.loads((folder / step_dir_name(2) / COMMIT_FILE).read_text())
    assert commit["step"] == 2 and commit["mode"] == mode and commit["world_size"] == 1
    on_disk = {p.name: p.stat().st_size for p in (folder / step_dir_name(2)).iterdir() if p.name != COMMIT_FILE}
    assert {name: f["size_bytes"] for name, f in commit["files"].items()} == on_disk
    assert ".metadata" in commit["files"]
    assert all(len(f["sha256"]) == 64 for f in commit["files"].values())


def test_only_the_newest_keep_checkpoints_survive(tmp_path):
    saved_run(tmp_path, 10, keep=2)
    infos = list_checkpoints(tmp_path / "checkpoints")
    assert [(i.step, i.committed) for i in infos] == [(8, True), (10, True)]
    assert [entry["pruned_steps"] for entry in journal(tmp_path)] == [[], [], [2], [4], [6]]


def test_maybe_save_follows_interval_and_enable(tmp_path):
    saved_run(tmp_path / "on", 7, interval=3)
    saved_run(tmp_path / "off", 7, interval=3, enable=False)
    assert [i.step for i in list_checkpoints(tmp_path / "on" / "checkpoints")] == [3, 6]
    assert list_checkpoints(tmp_path / "off" / "checkpoints") == []


@pytest.mark.parametrize("mode", MODES)
def test_journal_records_stall_and_total_write_time(tmp_path, mode):
    saved_run(tmp_path, 4, mode=mode)
    entries = journal(tmp_path)
    assert [e["step"] for e in entries] == [2, 4]
    for entry in entries:
        assert entry["mode"] == mode and entry["size_bytes"] > 0
        assert 0 <= entry["wait_previous_s"] <= entry["stall_s"] <= entry["write_s"]
        assert entry["stall_s"] > 0


def test_saving_a_step_that_is_already_committed_is_a_no_op(tmp_path):
    job = make_job()
    checkpointer = Checkpointer(ckpt_cfg(), tmp_path, rank=0)
    assert checkpointer.save(2, job.app()) is True
    assert checkpointer.save(2, job.app()) is False
    assert len(journal(tmp_path)) == 1


def test_load_latest_without_checkpoints_returns_none(tmp_path):
    assert Checkpointer(ckpt_cfg(), tmp_path, rank=0).load_latest(make_job().app()) is None


def test_a_run_with_checkpoints_disabled_does_not_resume(tmp_path):
    saved_run(tmp_path, 2)
    assert Checkpointer(ckpt_cfg(enable=False), tmp_path, rank=0).load_latest(make_job().app()) is None


def test_an_unfinished_tmp_checkpoint_is_never_loaded(tmp_path):
    saved_run(tmp_path, 4)
    folder = tmp_path / "checkpoints"
    unfinished = folder / f"{step_dir_name(6)}.tmp"
    shutil.copytree(folder / step_dir_name(4), unfinished)
    (unfinished / COMMIT_FILE).unlink()

    assert Checkpointer(ckpt_cfg(), tmp_path, rank=0).load_latest(make_job().app()) == 4


@pytest.mark.parametrize("how", ["overwrite", "truncate"])
def test_a_corrupt_newest_checkpoint_is_reported_and_the_previous_one_loaded(tmp_path, caplog, how):
    saved_run(tmp_path, 4)
    corrupt_checkpoint(tmp_path / "checkpoints" / step_dir_name(4), how=how)

    with caplog.at_level(logging.WARNING, logger="trainops.trainer.checkpoint"):
        step = Checkpointer(ckpt_cfg(), tmp_path, rank=0).load_latest(make_job().app())

    assert step == 2
    assert f"checkpoint {step_dir_name(4)} is corrupt: checksum mismatch in ['__0_0.distcp']" in caplog.text
    assert "falling back to the previous checkpoint" in caplog.text
    fallback = [e for e in journal(tmp_path) if e["event"] == "fallback"]
    assert [e["step"] for e in fallback] == [4]


def test_verify_accepts_a_complete_checkpoint(tmp_path):
    saved_run(tmp_path, 2)
    verdict = verify_checkpoint(tmp_path / "checkpoints" / step_dir_name(2))
    assert verdict.complete and verdict.committed and verdict.step == 2
    assert verdict.missing_files == [] and verdict.checksum_mismatches == []


def test_verify_reports_a_partial_checkpoint(tmp_path):
    saved_run(tmp_path, 2)
    path = tmp_path / "checkpoints" / step_dir_name(2)
    (path / COMMIT_FILE).unlink()
    verdict = verify_checkpoint(path)
    assert not verdict.complete and not verdict.committed
    assert "did not finish (partial)" in verdict.message


def test_verify_reports_a_missing_file(tmp_path):
    saved_run(tmp_path, 2)
    path = tmp_path / "checkpoints" / step_dir_name(2)
    (path / ".metadata").unlink()
    verdict = verify_checkpoint(path)
    assert not verdict.complete and verdict.missing_files == [".metadata"]
    assert "missing files ['.metadata']" in verdict.message


def test_verify_reports_a_corrupt_file(tmp_path):
    saved_run(tmp_path, 2)
    path = tmp_path / "checkpoints" / step_dir_name(2)
    corrupt_checkpoint(path)
    verdict = verify_checkpoint(path)
    assert not verdict.complete and verdict.checksum_mismatches == ["__0_0.distcp"]


def test_verify_reports_an_absent_folder(tmp_path):
    verdict = verify_checkpoint(tmp_path / "nowhere")
    assert not verdict.complete and "does not exist" in verdict.message


def test_list_checkpoints_shows_committed_and_unfinished_with_sizes(tmp_path):
    saved_run(tmp_path, 2)
    folder = tmp_path / "checkpoints"
    (folder / f"{step_dir_name(4)}.tmp").mkdir()
    infos = list_checkpoints(folder)
    assert [(i.step, i.committed) for i in infos] == [(2, True), (4, False)]
    assert infos[0].size_bytes == sum(p.stat().st_size for p in Path(infos[0].path).iterdir())
    assert infos[1].size_bytes == 0
