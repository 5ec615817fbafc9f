"""Review of the failure signatures (issue 44 review): a word inside another word, a loss line's
other fields, the job's own text about a preemption, a timeout-only network fallback, a failing
rank guessed without a world size, and a specific cause printed after a watchdog line. Each test
is the sceptic's case that the first version got wrong."""
from __future__ import annotations

import pytest

from trainops.tools.reliability.causes import diagnose
from trainops.tools.reliability.evidence import Evidence, _signature_evidence, inert
from trainops.tools.reliability.signature_match import match_lines, missing_ranks, ranked, split_lines

WATCHDOG = ("[E ProcessGroupNCCL.cpp:475] [Rank {r}] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 1800301 milliseconds before timing out.")


def _hits(log: str):
    return ranked(match_lines(split_lines(log), clean=inert))


def _diagnosed(log: str, **fields):
    return diagnose(Evidence(state=fields.pop("state", "failed"), exit_code=1, signatures=_hits(log), **fields))


@pytest.mark.parametrize("line", ["ImportError: Import error: cannot load apex", "csv export error in writer",
                                  "warning: the uplink downgrade was skipped", "sidelink down-sampled 2x"])
def test_port_error_and_link_down_inside_other_words_are_not_infiniband(line):
    assert not any(h.name == "nccl-ib" for h in _hits(line))
    assert _diagnosed(line).cause != "network"


def test_an_ib_port_error_and_link_down_on_nccls_ib_lines_still_are():
    for line in ("gpu-node-4:811:902 [5] NCCL WARN NET/IB : Got async event : port error",
                 "gpu-node-4:811:902 [5] NCCL WARN NET/IB : mlx5_0:1 link down"):
        assert _diagnosed(line).sub_cause == "infiniband", line


@pytest.mark.parametrize("line", ["step 10 | loss: 1.23 | grad_norm: inf", "loss=2.5 lr=inf scale=1",
                                  "train_loss 0.9 | val nan count 0"])
def test_a_finite_loss_beside_another_fields_nan_or_inf_is_not_a_nan_loss(line):
    assert not any(h.name == "nan-loss" for h in _hits(line))


@pytest.mark.parametrize("line", ["step 10 | loss: nan | grad_norm: 3.1", "loss = inf", "Loss is nan, stopping",
                                  "loss is inf at step 4", "train/loss=nan"])
def test_a_nan_or_inf_loss_value_is_a_nan_loss(line):
    assert any(h.name == "nan-loss" for h in _hits(line)), line


@pytest.mark.parametrize("line", ["the job was PREEMPTED by my own retry wrapper", "status: preempted",
                                  "REQUEUED 3 samples after a bad batch", "Job has timed out waiting for data"])
def test_the_jobs_own_words_about_preemption_or_requeue_are_not_the_schedulers_line(line):
    d = _diagnosed(line + "\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert d.cause == "gpu-memory" and d.requeue_helps is False, d


def test_slurms_exact_preemption_line_in_log_text_alone_is_medium_and_decides_no_requeue():
    line = "slurmstepd: error: *** JOB 42 ON gpu-3 CANCELLED AT 2024-05-01T10:00:00 DUE TO PREEMPTION ***"
    d = _diagnosed(line)
    assert (d.cause, d.sub_cause) == ("planned", "preemption")
    assert d.confidence == "medium" and d.requeue_helps is None
    assert _diagnosed(line.lower()).cause != "planned"  # Slurm prints it in capitals; a job's echo of it is not


def test_the_schedulers_own_preempted_state_is_preferred_and_is_high():
    d = _diagnosed("torch.OutOfMemoryError: CUDA out of memory.", state="cancelled", reason="PREEMPTED: None")
    assert (d.cause, d.sub_cause, d.confidence, d.requeue_helps) == ("planned", "preemption", "high", True)
    d = _diagnosed("", state="failed", reason="TIMEOUT: None")
    assert (d.cause, d.sub_cause, d.confidence) == ("planned", "time-limit", "high")


def test_a_watchdog_abort_whose_only_clue_is_a_frame_name_is_not_network_and_gets_no_requeue():
    line = ("rank 0: frame #4: c10d::ProcessGroupNCCL::WorkNCCL::checkTimeout(std::optional<std::chrono::duration<"
            "long, std::ratio<1l, 1000l> > >) + 0x1d2")
    ev = Evidence(state="failed", exit_code=1, error_lines=[line], signatures=_hits(line))
    d = diagnose(ev)
    assert d.cause == "hung-peer" and d.requeue_helps is not True, d


def test_gloo_and_c10d_timeouts_in_error_lines_are_not_network():
    for line in ("rank 1: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] gloo timeout",
                 "rank 1: Timed out waiting 1800000ms for recv operation to complete"):
        d = diagnose(Evidence(state="failed", exit_code=1, error_lines=[line], signatures=_hits(line)))
        assert d.cause != "network", (line, d)


def test_one_watchdog_line_names_no_failing_rank():
    ev = Evidence(state="failed", exit_code=1)
    _signature_evidence(ev, [WATCHDOG.format(r=1)])
    assert ev.failing_rank is None
    d = diagnose(ev)
    assert "rank 0" not in d.reason and "does not say which rank" in d.reason


def test_the_missing_rank_is_inferred_only_with_a_known_world_size_and_all_but_one_reporting():
    assert missing_ranks([1, 3, 2]) == []  # no world size: rank 0 or rank 4 or a second node's ranks
    assert missing_ranks([1, 3, 2], world_size=4) == [0]
    assert missing_ranks([1, 3], world_size=4) == []  # two missing: the log does not tell which stalled
    assert missing_ranks([0, 1, 2], world_size=4) == [3]
    ev = Evidence(state="failed", exit_code=1, world_size=4)
    _signature_evidence(ev, ["\n".join(WATCHDOG.format(r=r) for r in (1, 3, 2))])
    assert ev.failing_rank == 0


@pytest.mark.parametrize("line", ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                                  "OSError: [Errno 28] No space left on device",
                                  "RuntimeError: Error(s) in loading state_dict for Net: size mismatch for fc.weight"])
def test_a_specific_cause_printed_after_a_watchdog_line_is_the_cause(line):
    d = _diagnosed(WATCHDOG.format(r=1) + "\n" + line)
    assert d.quote == line and d.cause != "hung-peer", d
