"""Loss parity: every layout trains the same model as one process (tiny preset, seq 32,
global batch 8, 4 SGD steps, gloo on CPU).

Tolerance: 1e-4 absolute on losses near 6.0. All layouts run the same fp32 math; only the
order of reductions differs (sharded GEMMs, all-reduce, micro-batch sums), which moves an fp32
loss of 6 by a few ulps (ulp ~5e-7; measured differences are ~1e-6 after 4 steps). A real
fault is orders of magnitude larger: a gradient mis-scaled by 2x, a missing gradient reduction
or a wrongly sharded weight changes the step-2 loss by ~1e-2 with this SGD learning rate.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

WORKER = Path(__file__).with_name("parallel_worker.py")
ATOL = 1e-4
TWO_PROCESS = ["tp2", "tp2_sp", "fsdp2", "pp2_GPipe", "pp2_1F1B", "pp2_Interleaved1F1B",
               "pp2_InterleavedZeroBubble", "pp2_ZBVZeroBubble"]
FOUR_PROCESS = ["fsdp2_tp2", "pp2_fsdp2", "pp2_tp2"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_worker(tmp_path: Path, nproc: int, specs: list[str]) -> dict[str, list[float | None]]:
    """Launch the worker under torchrun and return its losses per case spec."""
    out = tmp_path / f"losses-{nproc}.json"
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={_free_port()}", str(WORKER), str(out), *specs]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def reference() -> list[float]:
    sys.path.insert(0, str(WORKER.parent))
    import parallel_worker

    return parallel_worker.reference_losses()


@pytest.fixture(scope="module")
def expected() -> list[float]:
    return reference()


@pytest.fixture(scope="module")
def two_process(tmp_path_factory) -> dict:
    return run_worker(tmp_path_factory.mktemp("pp2"), 2, TWO_PROCESS)


@pytest.fixture(scope="module")
def four_process(tmp_path_factory) -> dict:
    return run_worker(tmp_path_factory.mktemp("pp4"), 4, FOUR_PROCESS)


def test_reference_loss_moves_enough_to_expose_a_gradient_bug(expected):
    assert abs(expected[1] - expected[0]) > 100 * ATOL


@pytest.mark.slow
@pytest.mark.parametrize("case", TWO_PROCESS)
def test_two_process_layout_matches_one_process(two_process, expected, case):
    assert two_process[case] == pytest.approx(expected, abs=ATOL)


@pytest.mark.slow
@pytest.mark.parametrize("case", FOUR_PROCESS)
def test_four_process_layout_matches_one_process(four_process, expected, case):
    assert four_process[case] == pytest.approx(expected, abs=ATOL)
