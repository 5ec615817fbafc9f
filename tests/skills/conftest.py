"""Small, valid pieces of an evidence pack for tests (numbers shaped like a real CPU run),
handed to tests as the `factories` fixture; and `quick_sop`, one real `trainops sop --quick`
shared by the slow tests that read its pack."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainops.skills.evidence.model import (
    AblationRow,
    BaselineSummary,
    DrillResult,
    MetricSpread,
    PackEnvironment,
)
from trainops.trainer.config import load_config


def environment() -> PackEnvironment:
    return PackEnvironment(framework="trainops-trainer", framework_version="0.1.0", torch_version="2.13.0",
                                  hardware="cpu:x86_64", device_count=2, backend="gloo", scheduler="local")


def write_run(run_dir: Path, steps: int = 6, step_time_s: float = 0.1, mfu_pct: float = 2.0) -> Path:
    """A run folder as the trainer leaves it: its config.toml and per-rank metrics."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(load_config(preset="tiny").to_toml())
    with open(run_dir / "metrics.jsonl", "w", encoding="utf-8") as fh:
        for step in range(1, steps + 1):
            for rank in (0, 1):
                fh.write(json.dumps({"step": step, "rank": rank, "loss": 5.0 - 0.1 * step, "grad_norm": 1.0,
                                     "step_time_s": step_time_s * (3 if step == 1 else 1), "tokens_per_s": 1000.0,
                                     "flops_per_token": 1e6, "tflops": 0.01, "mfu_pct": mfu_pct, "peak_mem_gib": 0.1,
                                     "time": 1000.0 + step, "data_wait_s": 0.01, "peak_source": "measured GEMM"})
                         + "\n")
    return run_dir


def baseline(run_dirs: list[str]) -> BaselineSummary:
    m = MetricSpread(median=2.0, low=1.95, high=2.05, spread_pct=5.0)
    return BaselineSummary(model="tiny", parallel_layout="dp_shard=2", precision="fp32", repeats=max(3, len(run_dirs)),
                           warmup_steps_excluded=2, step_time_s=MetricSpread(median=0.1, low=0.09, high=0.11,
                                                                             spread_pct=20.0),
                           tokens_per_s=MetricSpread(median=1000, low=950, high=1050, spread_pct=10.0), mfu_pct=m,
                           peak_source="measured GEMM", data_wait_share_pct=10.0, run_dirs=run_dirs)


def ablation(change: float = 12.0, band: float = 5.0, verdict: str = "gain", vanished: bool = False) -> AblationRow:
    return AblationRow(knob="data_kind", value="synthetic", baseline_value="text", category="data-pipeline",
                       scale="tiny, 2 procs", scale_kind="small", mfu_change_pct=change, noise_band_pct=band,
                       beyond_noise=verdict != "within-noise", verdict=verdict, vanished_at_scale=vanished,
                       source_run="runs/arm-1", baseline_run="runs/base-1")


def drill(intact: bool = True) -> DrillResult:
    return DrillResult(fault="crash", run_dir="runs/drill-1", injected_at_step=6, injected_time=100.0,
                       detected_time=101.5, isolated_time=101.6, recovered_time=110.0, detection_latency_s=1.5,
                       isolation_granularity="rank", recovery_time_s=8.5, steps_lost=1,
                       checkpoint_used="checkpoints/step-00000005", async_checkpoint_intact=intact,
                       cause="software", detector="process_exit",
                       drill_record="runs/drill-1/drill.json")


@pytest.fixture
def factories():
    return sys.modules[__name__]


@pytest.fixture(scope="session")
def quick_sop(tmp_path_factory) -> dict:
    """`trainops sop --quick --json` for real (torchrun on the local scheduler, 2 gloo processes), run
    once per session: the SOP takes minutes on 2 cores, and its pack is read, not changed (an approval
    adds a decision beside it). Its output, and `home`: the workspace it ran in."""
    home = tmp_path_factory.mktemp("quick-sop-home")
    env = {**os.environ, "TRAINOPS_HOME": str(home), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(Path(sys.executable).parent / "trainops"), "sop", "--quick", "--json"], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {**json.loads(done.stdout), "home": str(home)}
