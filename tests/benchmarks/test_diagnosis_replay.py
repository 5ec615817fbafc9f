"""The diagnosis benchmark replays a posted failure through trainops' own launch path and scores
the interruption record it leaves."""
from __future__ import annotations

from trainops.benchmarks.diagnosis.replay import ENDS, load_cases, replay
from trainops.benchmarks.diagnosis.score import CLASS_TO_CAUSE, Scored, score, table
from trainops.tools.context import operator_session


def _case(slug):
    return next(c for c in load_cases() if c.slug == slug)


def test_every_case_has_a_class_trainops_maps_and_an_end_the_replay_knows():
    cases = load_cases()
    assert len(cases) >= 40
    assert {c.cause_class for c in cases} <= set(CLASS_TO_CAUSE)
    for case in cases:
        assert case.exit in ENDS or case.exit.split()[0].isdigit(), case.slug
        assert case.naming_line in case.log_path.read_text(), case.slug


def test_a_posted_log_ends_as_the_real_job_did_and_leaves_an_interruption_record(workspace):
    case = _case("kohya-h100-ecc-rank1")
    with operator_session():
        record = replay(case)
    assert record is not None and record.scheduler == "local"
    assert record.evidence.exit_code == 1
    assert any("uncorrectable ECC error" in line for line in record.evidence.error_lines)


def test_a_signal_end_is_replayed_as_that_signal(workspace):
    case = _case("knet-slurm-cgroup-oom-kill")
    assert case.end == "SIGKILL"
    with operator_session():
        record = replay(case)
    assert record is not None and record.evidence.signal == "SIGKILL"


def test_scoring_counts_wrong_at_high_and_a_requeue_where_it_cannot_help():
    case = _case("llamafactory-tokenize-30min-watchdog")
    wrong = Scored(case, "network", "high", True, False, "")
    rows = table([wrong])
    assert rows[-1] == "| **all** | 1 | 0 | 1 | 0 | 0 | 1 | 1 | 0 |"
    assert score(case, None).cause == "no record"
