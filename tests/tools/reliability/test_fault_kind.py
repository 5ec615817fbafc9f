"""The interruption record's fault kind comes from its typed cause and evidence, never from words in
its reason: a reason quotes the job's own lines, and a job can print 'heartbeat' or 'stall'."""
from __future__ import annotations

from trainops.tools.reliability.evidence import Evidence
from trainops.tools.reliability.interruptions import Interruption


def _record(cause: str, reason: str, **evidence) -> Interruption:
    return Interruption(id="local:1@0", job_id="1", scheduler="local", detected_at=1.0, cause=cause,
                        cause_reason=reason, evidence=Evidence(**evidence))


def test_a_hung_peer_is_a_hang_whatever_its_reason_says():
    assert _record("hung-peer", "collective timed out: rank 1 did not arrive").fault_kind == "hang"


def test_a_job_line_quoted_in_the_reason_does_not_make_a_hang():
    quoted = "the job's log reads 'heartbeat thread stalled, waiting'"
    assert _record("software", quoted).fault_kind is None
    assert _record("unclassified", quoted, silent_ranks=[1]).fault_kind == "crash"


def test_a_rank_trainops_saw_stopped_alive_is_a_hang():
    """A record an older classifier wrote (cause unclassified) still reads as a hang from the evidence."""
    record = _record("unclassified", "rank 1's beat stopped", ranks_at_end={0: "running", 1: "stopped"})
    assert record.fault_kind == "hang"
