"""The GPU MFU script, run on the CPU with `--allow-cpu --preset tiny`: its figures mean nothing
here, but a GPU loan is short and rare, so the code path it takes must already work."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainops.benchmarks.gpu_mfu import render, summarize_saves
from trainops.run_records import SaveEntry

REPO = Path(__file__).resolve().parents[2]


def test_without_a_gpu_the_script_refuses_and_points_at_the_cpu_suite(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_mfu.py"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "no CUDA device" in done.stderr and "make bench" in done.stderr


@pytest.mark.slow
def test_the_script_measures_an_arm_and_the_checkpoint_stalls(tmp_path, workspace):
    results = REPO / "benchmarks" / "RESULTS.md"
    before = results.read_text()
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_mfu.py"), "--allow-cpu", "--preset", "tiny",
                           "--arm", "bf16 eager", "--steps", "4", "--warmup", "1", "--seq-len", "32", "--batch", "2",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu-results.json").read_text())
    (arm,) = report["arms"]
    assert arm["status"] == "ok" and arm["mfu_pct"] > 0 and arm["tokens_per_s"] > 0
    assert all(report["checkpoint_stall_s"][mode] > 0 for mode in ("sync", "async", "async_pinned"))
    table = (tmp_path / "gpu-results.md").read_text()
    assert "| bf16 eager |" in table and "Checkpoint stall async_pinned:" in table
    assert results.read_text() == before  # a CPU check never publishes a GPU figure


def _save(stall_s: float, wait_previous_s: float, write_s: float):
    """One `save` entry as trainops.trainer.checkpoint journals it."""
    return SaveEntry(event="save", step=2, path="checkpoints/step-00000002", time=0.0, stall_s=stall_s,
                     wait_previous_s=wait_previous_s, write_s=write_s, size_bytes=15 * 2**30)


def test_a_checkpoint_stall_leaves_out_the_wait_for_the_previous_background_write():
    summary = summarize_saves([_save(10.0, 0.0, 40.0), _save(37.8, 29.1, 67.4)])
    assert summary["stalls_s"] == pytest.approx([10.0, 8.7])
    assert summary["wait_previous_s"] == pytest.approx(29.1) and summary["failure"] is None
    assert summarize_saves([]) is None


def test_a_run_that_fails_after_a_save_still_reports_that_save_and_names_its_failure():
    args = argparse.Namespace(preset="llama3-1b", seq_len=2048, batch=8, steps=30, warmup=10,
                              checkpoint_steps=4, checkpoint_interval=2)
    stalls = {"sync": summarize_saves([_save(40.0, 0.0, 40.0)]),
              "async_pinned": summarize_saves([_save(5.0, 0.0, 33.8)], "rank 0 failed: KeyError")}
    machine = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0", "measured_utc": "2026-11-30 23:24 UTC"}
    text = "\n".join(render(args, [], stalls, machine))
    assert "NVIDIA H200, torch 2.11.0+cu130 (CUDA 13.0); llama3-1b preset" in text
    assert "Checkpoint stall async_pinned: 5.000 s vs sync 40.000 s (ratio 0.125" in text
    assert "Then the run failed: rank 0 failed: KeyError." in text
    assert "Checkpoint stall async: not measured yet." in text
