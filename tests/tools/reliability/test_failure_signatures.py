"""Failure signatures as data (issue 44 items 1-3, 5-7): a specific line outranks a generic one, a
collective timeout is a hung peer unless network evidence says otherwise, the next step fits the
cause, 'high' is kept for a specific signature with nothing against it, and a foreign log's
prefixes name the rank and device. Written from the sources' own texts, not from the benchmark's cases."""
from __future__ import annotations

import sys

import pytest

from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.reliability.causes import CAUSES, diagnose
from trainops.tools.reliability.evidence import Evidence, _signature_evidence, inert
from trainops.tools.reliability.interruptions import read_interruptions
from trainops.tools.reliability.signature_match import match_lines, ranked, split_lines
from trainops.tools.reliability.signatures import SIGNATURES

pytestmark = pytest.mark.usefixtures("as_operator")


def _diagnosed(log: str, **fields):
    hits = ranked(match_lines(split_lines(log), clean=inert))
    return diagnose(Evidence(state="failed", exit_code=1, signatures=hits, **fields))


def test_every_signature_is_one_entry_with_a_known_cause_a_next_step_and_a_source():
    assert len({s.name for s in SIGNATURES}) == len(SIGNATURES)
    for sig in SIGNATURES:
        assert sig.cause in CAUSES and sig.next_step and sig.source and 0 <= sig.specificity <= 4, sig.name
    assert {s.cause for s in SIGNATURES} >= {"hung-peer", "network", "hardware", "gpu-memory", "host-memory",
                                            "storage", "configuration", "data", "planned", "software"}


def test_an_ecc_error_is_hardware_and_quoted_not_the_traceback_or_the_watchdog_abort():
    log = ("Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
           "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
           "[E ProcessGroupNCCL.cpp:916] [Rank 1] NCCL watchdog thread terminated with exception: CUDA error\n")
    d = _diagnosed(log)
    assert (d.cause, d.sub_cause, d.confidence) == ("hardware", "ecc", "high")
    assert d.quote == "RuntimeError: CUDA error: uncorrectable ECC error encountered"
    assert d.requeue_helps is False and "known-answer" in d.next_step


def test_a_collective_timeout_is_a_hung_peer_and_names_the_rank_that_did_not_arrive():
    log = "\n".join(f"[E ProcessGroupNCCL.cpp:475] [Rank {r}] Watchdog caught collective operation timeout: "
                    "WorkNCCL(SeqNum=7, OpType=ALLREDUCE) ran for 1800301 milliseconds before timing out."
                    for r in (1, 3, 2))
    ev = Evidence(state="failed", exit_code=1, world_size=4)  # the world size known (heartbeats, the job's spec)
    _signature_evidence(ev, [log + "\nslurmstepd: error: Failed to send MESSAGE_TASK_EXIT: Connection refused"])
    d = diagnose(ev)
    assert d.cause == "hung-peer" and "rank 0" in d.reason and d.confidence != "high" and ev.failing_rank == 0
    assert d.requeue_helps is False and "same time again" in d.next_step


def test_network_evidence_turns_a_timeout_into_network():
    log = ("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(OpType=ALLREDUCE) ran for 600000 "
           "milliseconds before timing out.\n"
           "node7:1234:1290 [3] NCCL WARN NET/IB : Got async event : port error\n")
    d = _diagnosed(log)
    assert d.cause == "network" and d.sub_cause == "infiniband" and "hung-peer" in d.alternatives


def test_the_schedulers_preemption_line_beats_a_teardown_connection_refused():
    log = ("slurmstepd: error: *** JOB 42 ON gpu-3 CANCELLED AT 2024-05-01T10:00:00 DUE TO PREEMPTION ***\n"
           "slurmstepd: error: Failed to send MESSAGE_TASK_EXIT: Connection refused\n")
    d = _diagnosed(log)  # the job's output alone: planned, but not 'high' and no requeue decided on it
    assert (d.cause, d.sub_cause, d.requeue_helps, d.confidence) == ("planned", "preemption", None, "medium")


@pytest.mark.parametrize(("line", "cause"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "gpu-memory"),
    ("OSError: [Errno 28] No space left on device", "storage"),
    ("RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory", "storage"),
    ("RuntimeError: Error(s) in loading state_dict for Net: size mismatch for fc.weight", "configuration"),
    ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
     "host-memory"),
    ("torch.distributed.DistBackendError: NCCL error: unhandled system error, ncclSystemError: System call "
     "(e.g. socket, malloc) or external library call failed", "network"),
    ("FloatingPointError: Minimum loss scale reached (0.0001).", "data"),
    ("slurmstepd: error: *** STEP 9.0 ON n1 CANCELLED AT 2025-01-10T15:27:25 DUE TO TIME LIMIT ***", "planned"),
])
def test_a_specific_line_names_its_class_and_a_deterministic_one_gets_no_requeue(line, cause):
    d = _diagnosed("Traceback (most recent call last):\n" + line)
    assert d.cause == cause and d.quote == line, d
    if cause in ("gpu-memory", "configuration", "storage", "data", "network"):
        assert d.requeue_helps is False
    if "ncclSystemError" in line:  # NCCL's own text names a family of causes: never high on its own
        assert d.confidence == "medium"


def test_a_device_side_assert_quotes_the_assertion_not_the_abort():
    log = ("../aten/src/ATen/native/cuda/Indexing.cu:1146: indexSelectLargeIndex: block: [0,0,0] Assertion "
           "`srcIndex < srcSelectDimSize` failed.\nFatal Python error: Aborted\n")
    d = _diagnosed(log)
    assert d.cause == "configuration" and "srcIndex < srcSelectDimSize" in d.quote


def test_a_generic_exception_is_software_never_at_high_and_names_the_jobs_framework():
    log = "[rank3]: File \"deepspeed/runtime/engine.py\", line 9\n[rank3]: KeyError: 'lm_head'\n"
    d = _diagnosed(log, framework="a DeepSpeed job")
    assert d.cause == "software" and d.confidence != "high" and "DeepSpeed" in d.reason
    assert "KeyError: 'lm_head'" in d.quote and "the trainer" not in d.reason


def test_foreign_prefixes_become_rank_and_device():
    hits = match_lines(split_lines("[default2]:[rank2]: torch.OutOfMemoryError: CUDA out of memory on GPU 2\n"
                                   "gpu-node-4:811:902 [5] NCCL WARN NET/IB : Got async event : port error"))
    oom = next(h for h in hits if h.name == "cuda-oom")
    ib = next(h for h in hits if h.name == "nccl-ib")
    assert (oom.rank, oom.device) == (2, 2) and (ib.device, ib.host) == (5, "gpu-node-4")


def test_nothing_specific_is_unclassified_and_says_what_to_collect():
    d = _diagnosed("epoch 3 step 200 loss 2.1\n")
    assert d.cause == "unclassified" and d.confidence == "low" and "kernel log" in d.next_step


def test_a_posted_log_run_as_a_job_is_recorded_with_its_signature(workspace):
    workspace.mkdir(parents=True, exist_ok=True)
    log = workspace / "posted.log"
    log.write_text("[Rank 1] NCCL watchdog thread terminated with exception: CUDA error: uncorrectable ECC error "
                   "encountered\n")
    script = f"print(open({str(log)!r}).read()); raise SystemExit(1)"
    spec = {"name": "ecc-job", "command": [sys.executable, "-c", script]}
    job = call("submit_job", {"spec": spec}, CallContext(actor="operator")).handle.job_id
    call("wait_job", {"job_id": job, "timeout_s": 60}, CallContext(actor="operator"))
    rec = read_interruptions(job)[-1]
    seen = (rec.cause_reason, rec.evidence.not_taken, rec.evidence.state, rec.evidence.exit_code, rec.started_at,
            rec.ended_at)  # failed once in a loaded fresh-clone run (unclassified, low), never alone
    assert (rec.cause, rec.sub_cause, rec.confidence, rec.requeue_helps) == ("hardware", "ecc", "high", False), seen
    assert "uncorrectable ECC error" in rec.quote and rec.evidence.failing_rank == 1
    assert "job's own text" in rec.cause_reason  # a hardware suspicion from a log is labelled where it came from
