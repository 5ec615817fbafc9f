"""Multi-node training for real: the embedded trainer runs FSDP2 and DDP across two namespace nodes of
a `trainops sandbox` Slurm cluster (srun + torchrun, c10d rendezvous on the first node, gloo bound to
each node's own interface), and every rank's heartbeat and metrics reach the shared run folder."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trainops.tools.base import CallContext, call

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.usefixtures("as_operator")]
OPERATOR = CallContext(actor="operator")


def _train_on_two_nodes(extra: list[str]) -> tuple[dict, Path]:
    out = call("submit_job", {"scheduler": "slurm", "name": "multinode", "training": {
        "preset": "tiny", "nproc": 1, "nodes": 2,
        "overrides": ["training.steps=6", "data.kind=synthetic", *extra]}}, OPERATOR)
    job_id = out.handle.job_id
    deadline = time.monotonic() + 180
    while True:
        status = call("job_status", {"scheduler": "slurm", "job_id": job_id}, OPERATOR)
        if status.state in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    logs = call("job_logs", {"scheduler": "slurm", "job_id": job_id, "tail": 40}, OPERATOR).text
    assert status.state == "completed", f"{status.state} ({status.reason}):\n{logs}"
    return status.model_dump(), Path(out.handle.run_dir)


@pytest.mark.parametrize("data_parallel", ["fsdp", "ddp"])
def test_the_trainer_runs_across_two_nodes_and_every_rank_reports_to_the_run_folder(sandbox_cluster, data_parallel):
    status, run_dir = _train_on_two_nodes([f"parallel.data_parallel={data_parallel}"])
    assert status["nodes"] == ["n1", "n2"]
    hosts = {json.loads(p.read_text())["host"] for p in (run_dir / "heartbeat").glob("rank*.json")}
    assert hosts == {"n1", "n2"}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {r["rank"] for r in records} == {0, 1}
    assert max(r["step"] for r in records) == 6
    final = json.loads((run_dir / "status.json").read_text())
    assert final["status"] == "ok"
