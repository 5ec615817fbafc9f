"""On the sandbox cluster a bit flip injected on one node ends with that node named and drained: the
bit-flip drill's checksum mismatch runs the known-answer check through Slurm on every node and
beside a known-good one, and the node that computes wrong (the one the flip marked: emulated bad
hardware, see tools/reliability/sdc_check.py) is drained through the gated drain_node, the case pending a human."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainops.skills.drill.drill import drill
from trainops.skills.request import JobRequest
from trainops.skills.sdc import CASE_FILE, SdcCase
from trainops.tools.calls import call
from trainops.tools.governance import queue

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.usefixtures("as_operator")]
DRILL_JOB = ["training.steps=12", "data.kind=synthetic", "checkpoint.enable=true", "checkpoint.interval=2",
             "checkpoint.mode=async", "checkpoint.keep=50"]


def test_a_bit_flip_on_one_node_ends_with_that_node_named_and_drained(sandbox_cluster, workspace):
    try:
        result, _row = drill(JobRequest(scheduler="slurm", nproc=1, nodes=2, overrides=DRILL_JOB, timeout_s=240),
                             "bitflip")
        case = SdcCase.model_validate(json.loads((Path(result.run_dir) / CASE_FILE).read_text()))
        assert case.fleet.nodes == ["n1", "n2", "n3"] and case.fleet.failed_nodes == ["n2"]  # rank 1 ran on n2
        # two replicas disagree: the checksum names one of them; the tests say which node computes wrong
        assert case.suspect.node in ("n1", "n2") and case.colocated.job_id
        assert case.colocated.failed_nodes == (["n2"] if case.suspect.node == "n2" else [])
        assert case.drained == ["n2"]
        nodes = {n.name: n.state for n in call("list_nodes", {"scheduler": "slurm"}).nodes}
        assert nodes["n2"] in ("drained", "draining"), nodes
        pending = queue.get_pending(case.pending_id)
        assert pending.tool == "acknowledge_escalation" and "drained n2" in pending.input["detail"]
    finally:
        call("resume_node", {"node": "n2", "scheduler": "slurm"})
