"""Signatures for error texts a class already covered from one source but missed from another
(issue 44 item 1): Python's own source line of a failed divisibility assert, NumPy's reshape error
beside PyTorch's, fairseq's loss-scaler overflow beside DeepSpeed's and apex's. Texts are written
from each source's message format, not copied from the benchmark's cases."""
from __future__ import annotations

import pytest

from trainops.tools.reliability.causes import diagnose
from trainops.tools.reliability.evidence import Evidence, inert
from trainops.tools.reliability.signature_match import match_lines, ranked, split_lines


def _diagnosed(log: str):
    hits = ranked(match_lines(split_lines(log), clean=inert))
    return diagnose(Evidence(state="failed", exit_code=1, signatures=hits))


@pytest.mark.parametrize("assert_line", ["    assert cfg.hidden_size % cfg.num_heads == 0",
                                         "[rank1]:     assert global_batch % (micro_batch * dp) == 0, 'batch'"])
def test_a_failed_divisibility_assert_is_configuration_quoting_the_assert(assert_line):
    log = ("Traceback (most recent call last):\n  File \"model.py\", line 40, in __init__\n"
           f"{assert_line}\nAssertionError\n")
    d = _diagnosed(log)
    assert (d.cause, d.sub_cause) == ("configuration", "not-divisible") and d.quote == assert_line.strip(), d
    assert d.requeue_helps is False


def test_a_modulo_that_is_not_an_assert_is_not_a_divisibility_check():
    assert not any(h.name == "not-divisible" for h in match_lines(["    ok = step % log_every == 0"]))


def test_numpys_reshape_error_is_a_shape_mismatch_like_pytorchs():
    d = _diagnosed("ValueError: cannot reshape array of size 12 into shape (5,newaxis)\n")
    assert (d.cause, d.sub_cause) == ("configuration", "shape-mismatch"), d


def test_fairseqs_overflow_warnings_are_a_low_confidence_numerics_hint():
    """Scales still above 1: the routine search for a scale (below 1 is a collapse: test_signature_families)."""
    log = "\n".join(f"| WARNING: overflow detected, setting loss scale to: {2.0 ** k}" for k in range(7, 2, -1))
    d = _diagnosed(log + "\nTraceback (most recent call last):\n")
    assert (d.cause, d.sub_cause, d.confidence) == ("data", "fp16-overflow", "low"), d


def test_an_end_with_only_a_generic_line_stays_unclassified_and_quotes_what_it_saw():
    line = "slurmstepd: error: *** STEP 77.0 ON n3 CANCELLED AT 2025-02-01T10:00:00 ***"
    d = _diagnosed(f"epoch 5/5 loss 2.1\n{line}\n")
    assert d.cause == "unclassified" and d.quote == line, d
    assert "not enough alone" in d.reason and "sacct" in d.reason


def test_a_shells_killed_report_is_a_host_memory_hint_not_a_verdict():
    d = _diagnosed("epoch 5/5 loss 2.1\n/bin/bash: line 12:  4242 Killed                  python train.py\n")
    assert (d.cause, d.confidence) == ("host-memory", "low") and d.quote.startswith("/bin/bash: line 12:  4242"), d
    assert "OOM killer" in d.reason and "kernel log" in d.next_step


def _announcements(ranks: list[int], world: int) -> str:
    return "\n".join(f"Initializing distributed: GLOBAL_RANK: {r}, MEMBER: {r + 1}/{world}" for r in ranks)


def test_the_same_global_rank_announced_twice_is_a_launch_that_does_not_match_the_world():
    d = _diagnosed(_announcements([0, 1, 2, 3, 0, 1, 2, 3], world=8) + "\nTraceback (most recent call last):\n")
    assert (d.cause, d.sub_cause) == ("configuration", "parallel-size") and d.confidence == "medium", d
    assert "GLOBAL_RANK: 0, MEMBER: 1/8" in d.quote and "(rank " not in d.reason


def test_each_global_rank_announced_once_is_no_evidence():
    assert not any(h.name == "duplicate-global-rank" for h in match_lines(split_lines(_announcements(
        list(range(8)), world=8))))
