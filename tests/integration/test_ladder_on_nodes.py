"""The rollout ladder's node rungs on the sandbox cluster (issue 26 item 3): an arm judged at one
process climbs to a second node, its jobs placed by Slurm on two namespace nodes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainops.skills.request import JobRequest

pytestmark = [pytest.mark.services, pytest.mark.slow]
SHORT = ["training.seq_len=32", "training.global_batch=8", "training.steps=4", "data.kind=synthetic",
         "training.micro_batch=1"]


def test_an_arm_climbs_from_one_process_to_two_nodes_on_slurm(sandbox_cluster, workspace, monkeypatch):
    from trainops.skills.ablation import ablate
    from trainops.tools.base import operator_session

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    req = JobRequest(preset="tiny", nproc=1, nodes=2, scheduler="slurm", timeout_s=240, warmup_steps=1,
                     overrides=SHORT)
    with operator_session():
        rows, evidence = ablate(req, ["micro_batch=4"], repeats=1)
    assert [(r.world_size, r.scale_kind) for r in rows][:1] == [(1, "small")]
    assert rows[0].verdict == "gain"  # one accumulation pass instead of four: a gain at one process
    assert [r.world_size for r in rows] == [1, 2] and rows[1].scale == "2 nodes x 1 process"
    two_rank_runs = [p.parent for p in Path(workspace).rglob("metrics.jsonl")
                     if any(json.loads(line)["rank"] == 1 for line in p.read_text().splitlines())]
    assert len(two_rank_runs) >= 2, "the node rung ran no baseline and arm"
    for run in two_rank_runs:  # Slurm placed each rank on a node of its own
        hosts = {json.loads(beat.read_text())["host"] for beat in (run / "heartbeat").glob("rank*.json")}
        assert len(hosts) == 2 and hosts <= {"n1", "n2", "n3"}, (run, hosts)
    assert any("--scheduler slurm --nodes 2" in row.command for row in evidence)
