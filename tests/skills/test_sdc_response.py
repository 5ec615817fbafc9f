"""A suspected silent data corruption sets off the known-answer checks through the scheduler, drains
the node that fails where a good one remains, and hands the case to a human (R-ESC-3)."""
from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from trainops.skills.drill.drill import drill
from trainops.skills.request import JobRequest
from trainops.skills.sdc import CASE_FILE, SdcCase, fleet_nodes, run_check
from trainops.tools.context import CallContext
from trainops.tools.governance import queue
from trainops.tools.reliability.interruptions import read_interruptions
from trainops.tools.reliability.sdc_check import KNOWN_ANSWER_FAILED
from trainops.tools.schedulers.base import NodeInfo
from trainops.trainer.faults import mark_host_defective

pytestmark = pytest.mark.usefixtures("as_operator")
DRILL_JOB = ["training.steps=12", "training.seq_len=64", "training.global_batch=8", "training.micro_batch=4",
             "checkpoint.enable=true", "checkpoint.interval=2", "checkpoint.mode=async", "checkpoint.keep=50"]


@pytest.mark.slow
def test_the_known_answer_check_passes_on_a_sound_host_and_fails_on_the_one_a_bit_flip_marked(workspace):
    host = socket.gethostname()
    ctx = CallContext(actor="operator")
    sound = run_check("fleet", [host], [host], "local", ctx, 120)
    assert (sound.state, sound.failed_nodes, [r.gemm_ok for r in sound.results]) == ("completed", [], [True])
    mark_host_defective({"host": host, "kind": "bitflip", "step": 5})
    marked = run_check("fleet", [host], [host], "local", ctx, 120)
    assert marked.failed_nodes == [host] and marked.results[0].gemm_wrong_elements == 1
    assert marked.results[0].emulated_defect and marked.state == "failed"

    # the verdict is the check's answer read from its scheduler log; its failure line in a job's record is quoted
    record = next(r for r in read_interruptions(marked.job_id))
    assert record.cause != "hardware" and any(KNOWN_ANSWER_FAILED in line for line in record.evidence.error_lines)


@pytest.mark.slow
def test_a_bitflip_drill_tests_the_node_quarantines_and_hands_the_case_to_a_human(workspace):
    result, _row = drill(JobRequest(overrides=DRILL_JOB, timeout_s=300), "bitflip")
    case = SdcCase.model_validate(json.loads((Path(result.run_dir) / CASE_FILE).read_text()))
    host = socket.gethostname()
    assert (case.suspect.rank, case.suspect.node, case.suspect.step) == (1, host, 5)
    assert case.fleet.job_id and case.fleet.failed_nodes == [host]  # the flipped host computes wrong
    assert not case.colocated.job_id and "known-good" in case.colocated.note  # one node: nothing to sit beside
    assert case.drained == []  # no node that passed remains: draining would leave nothing to restart on
    pending = queue.get_pending(case.pending_id)
    assert pending.tool == "acknowledge_escalation" and pending.input["rule_id"] == "R-ESC-3"
    assert any("fleet test" in line for line in pending.input["results"])
    assert result.async_checkpoint_intact  # the drill still restarted from a checkpoint before the flip


def test_the_fleet_check_covers_the_suspects_partition_not_a_shadow_partitions_node():
    """A shadow partition's node cannot run the job partition's check jobs: it is left out of the fleet."""
    nodes = [NodeInfo(name=f"n{k}", state="idle", partitions=["sandbox"]) for k in (1, 2, 3)]
    nodes += [NodeInfo(name="n4", state="idle", partitions=["shadow"]), NodeInfo(name="n5", state="down",
                                                                                  partitions=["sandbox"])]
    assert fleet_nodes(nodes, "n2") == ["n1", "n2", "n3"]
    assert fleet_nodes([NodeInfo(name="vm", state="idle")], "vm") == ["vm"]  # no partitions: every usable node
