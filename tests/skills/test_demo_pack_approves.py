"""The demo's own pack, approved as a human would approve it: `trainops sop --quick` in a fresh
workspace (the `quick_sop` fixture), then `trainops approve PACK` with a key that the test's
allowed-signers file lists. Approval runs every evidence validator, R-ABL-1 among them: each
ablation arm against the baseline of its own rung of the ladder."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TRAINOPS = str(Path(sys.executable).parent / "trainops")


@pytest.mark.slow
def test_the_demo_pack_is_approved_with_a_listed_key(quick_sop, approvers):
    pack_id = Path(quick_sop["pack_dir"]).name
    env = {**os.environ, "TRAINOPS_HOME": quick_sop["home"], "OMP_NUM_THREADS": "1"}
    done = subprocess.run([TRAINOPS, "approve", pack_id, "--key", str(approvers.alice.key), "--note", "demo",
                           "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    decision = json.loads(done.stdout)
    assert (decision["decision"], decision["principal"]) == ("approved", "alice")
