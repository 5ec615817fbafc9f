"""Fault injection points, each observed directly: exit code, a process that stops making
progress, a NaN loss, exactly one flipped parameter element, a slow step, a corrupt checkpoint.
Every injection leaves a timed record in faults.jsonl."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from trainops.trainer.checkpoint import AppState, Checkpointer
from trainops.trainer.checkpoint_files import step_dir_name, verify_checkpoint
from trainops.trainer.config import CheckpointConfig, FaultsConfig
from trainops.trainer.faults import CRASH_EXIT_CODE, FaultInjector, exponent_msb, flip_bit

REPO = Path(__file__).resolve().parents[2]


def records(run_dir: Path) -> list[dict]:
    path = run_dir / "faults.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start_injected_loop(run_dir: Path, faults: str) -> subprocess.Popen:
    """A process that runs steps 0..9 through a FaultInjector built from `faults` (kwargs)."""
    script = textwrap.dedent(f"""
        import time
        from trainops.trainer.config import FaultsConfig
        from trainops.trainer.faults import FaultInjector
        injector = FaultInjector(FaultsConfig({faults}), rank=0, run_dir={str(run_dir)!r})
        for step in range(10):
            injector.on_step_start(step)
            time.sleep(0.01)
        """)
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flip_bit_changes_exactly_the_requested_bit(dtype):
    values = torch.linspace(-1, 1, 9, dtype=dtype)
    before = values.clone()
    flip_bit(values, 4, exponent_msb(dtype))
    width = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
    xor = before.view(width) ^ values.view(width)
    assert xor[4].item() == 1 << exponent_msb(dtype)
    assert torch.count_nonzero(xor).item() == 1


def test_bitflip_changes_one_parameter_element_on_the_configured_rank_and_step(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    before = [p.detach().clone() for p in model.parameters()]
    other_rank = FaultInjector(FaultsConfig(bitflip_step=3, bitflip_rank=1), rank=0, run_dir=tmp_path)
    injector = FaultInjector(FaultsConfig(bitflip_step=3, bitflip_rank=1), rank=1, run_dir=tmp_path)

    assert injector.after_step(2, model) is None and other_rank.after_step(3, model) is None
    record = injector.after_step(3, model)

    changed = sum(torch.count_nonzero(p != b).item() for p, b in zip(model.parameters(), before, strict=True))
    assert changed == 1
    assert record["parameter"] == "0.weight" and record["bit"] == 30
    assert abs(record["new_value"]) > 1e30 or record["new_value"] != record["new_value"]
    assert [(r["kind"], r["step"], r["rank"]) for r in records(tmp_path)] == [("bitflip", 3, 1)]


def test_bitflip_skips_embeddings_for_a_projection_every_token_uses(tmp_path):
    model = torch.nn.Sequential(torch.nn.Embedding(16, 4), torch.nn.Linear(4, 4))
    record = FaultInjector(FaultsConfig(bitflip_step=1), rank=0, run_dir=tmp_path).after_step(1, model)
    assert record["parameter"] == "1.weight" and record["index"] == 8


def test_nan_replaces_the_loss_only_at_the_configured_step(tmp_path):
    injector = FaultInjector(FaultsConfig(nan_step=5), rank=0, run_dir=tmp_path)
    loss = torch.tensor(2.5, requires_grad=True)
    assert injector.after_loss(4, loss).item() == 2.5
    poisoned = injector.after_loss(5, loss)
    assert torch.isnan(poisoned)
    poisoned.backward()
    assert torch.isnan(loss.grad)
    assert [(r["kind"], r["step"]) for r in records(tmp_path)] == [("nan", 5)]


def test_slow_rank_sleeps_each_step_and_records_once(tmp_path):
    injector = FaultInjector(FaultsConfig(slow_rank=0, slow_ms=50), rank=0, run_dir=tmp_path)
    started = time.perf_counter()
    for step in range(3):
        injector.on_step_start(step)
    assert time.perf_counter() - started >= 0.15
    assert [(r["kind"], r["slow_ms"]) for r in records(tmp_path)] == [("slow", 50)]


def test_a_rank_that_is_not_faulted_runs_untouched(tmp_path):
    cfg = FaultsConfig(crash_step=1, crash_rank=1, hang_step=1, hang_rank=1, slow_rank=1, slow_ms=1000)
    injector = FaultInjector(cfg, rank=0, run_dir=tmp_path)
    started = time.perf_counter()
    for step in range(3):
        injector.on_step_start(step)
    assert time.perf_counter() - started < 0.5 and records(tmp_path) == []


@pytest.mark.parametrize("mode, returncode", [("exit", CRASH_EXIT_CODE), ("sigkill", -signal.SIGKILL)])
def test_crash_ends_the_process_with_its_code_and_records_when(tmp_path, mode, returncode):
    started = time.time()
    process = start_injected_loop(tmp_path, f"crash_step=3, crash_mode={mode!r}")
    assert process.wait(timeout=60) == returncode
    (record,) = records(tmp_path)
    assert record["kind"] == "crash" and record["step"] == 3 and record["mode"] == mode
    assert started < record["time"] < time.time()


def test_hang_stops_progress_without_exiting(tmp_path):
    process = start_injected_loop(tmp_path, "hang_step=2")
    try:
        deadline = time.time() + 30
        while not records(tmp_path) and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
        assert process.poll() is None
        assert [(r["kind"], r["step"]) for r in records(tmp_path)] == [("hang", 2)]
    finally:
        process.kill()
        process.wait()


def _save_two_checkpoints(run_dir: Path) -> Path:
    model = torch.nn.Linear(16, 16)
    app = AppState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    checkpointer = Checkpointer(CheckpointConfig(enable=True, interval=1), run_dir, rank=0)
    checkpointer.save(1, app)
    checkpointer.save(2, app)
    checkpointer.close()
    return checkpointer.folder


def test_corrupt_checkpoint_at_train_end_damages_only_the_newest(tmp_path):
    folder = _save_two_checkpoints(tmp_path)
    injector = FaultInjector(FaultsConfig(corrupt_checkpoint=True), rank=0, run_dir=tmp_path)
    record = injector.on_train_end(folder)
    assert record["step"] == 2 and record["file"] == "__0_0.distcp"
    assert not verify_checkpoint(folder / step_dir_name(2)).complete
    assert verify_checkpoint(folder / step_dir_name(1)).complete


def test_corrupt_checkpoint_is_off_unless_configured_and_only_on_rank_0(tmp_path):
    folder = _save_two_checkpoints(tmp_path)
    assert FaultInjector(FaultsConfig(), rank=0, run_dir=tmp_path).on_train_end(folder) is None
    assert FaultInjector(FaultsConfig(corrupt_checkpoint=True), rank=1, run_dir=tmp_path).on_train_end(folder) is None
    assert verify_checkpoint(folder / step_dir_name(2)).complete and records(tmp_path) == []


def test_a_restarted_rank_does_not_fire_a_one_shot_fault_again(tmp_path):
    cfg = FaultsConfig(nan_step=5, bitflip_step=5, bitflip_rank=0, crash_step=5, hang_step=5)
    first = FaultInjector(cfg, rank=0, run_dir=tmp_path)
    assert torch.isnan(first.after_loss(5, torch.tensor(1.0)))
    assert first.after_step(5, torch.nn.Linear(4, 4)) is not None
    with (tmp_path / "faults.jsonl").open("a") as fh:  # as a crash and a hang before the restart leave them
        for kind in ("crash", "hang"):
            fh.write(json.dumps({"kind": kind, "step": 5, "rank": 0, "time": 0}) + "\n")
    restarted = FaultInjector(cfg, rank=0, run_dir=tmp_path)  # the requeued run reads the same config
    started = time.perf_counter()
    restarted.on_step_start(5)  # would exit (crash) or block forever (hang) if they fired again
    assert time.perf_counter() - started < 0.5
    assert restarted.after_loss(5, torch.tensor(1.0)).item() == 1.0
    assert restarted.after_step(5, torch.nn.Linear(4, 4)) is None
    assert [r["kind"] for r in records(tmp_path)] == ["nan", "bitflip", "crash", "hang"]


def test_a_fault_fired_on_another_rank_or_by_a_drill_tool_still_fires_here(tmp_path):
    (tmp_path / "faults.jsonl").write_text(json.dumps({"kind": "nan", "step": 5, "rank": 1, "time": 0}) + "\n"
                                           + json.dumps({"kind": "corrupt_checkpoint", "time": 0, "file": "x"}) + "\n")
    injector = FaultInjector(FaultsConfig(nan_step=5), rank=0, run_dir=tmp_path)
    assert torch.isnan(injector.after_loss(5, torch.tensor(1.0)))
    assert injector.fired == {"nan"}


def test_a_straggler_stays_slow_after_a_restart(tmp_path):
    cfg = FaultsConfig(slow_rank=0, slow_ms=100)
    FaultInjector(cfg, rank=0, run_dir=tmp_path).on_step_start(1)
    restarted = FaultInjector(cfg, rank=0, run_dir=tmp_path)
    started = time.perf_counter()
    restarted.on_step_start(2)
    assert time.perf_counter() - started >= 0.1
