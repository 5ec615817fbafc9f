"""The GPU MFU script, run on the CPU with `--allow-cpu --preset tiny`: its figures mean nothing
here, but a GPU loan is short and rare, so the code path it takes must already work."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
