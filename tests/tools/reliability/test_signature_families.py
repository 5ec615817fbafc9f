"""Text families a class covered from one source's wording and missed from another's (issue 44
items 1, 2, 4, 5), one mechanism each: a scheduler's cancel line that names no reason is not a
planned end (only the scheduler's own state says preemption or cancel), a rank waiting in the c10d
store for the rank that publishes the NCCL id is a hung peer, not the exception it raises, an
unannounced SIGKILL of a training process is a host-memory hint, NCCL's own result codes (its
argument checks, its `file:line -> N` trace), a checkpoint writer that cannot open its file, and a
NaN/inf loss in every framework's spelling. Logs are written from each source's message format,
not copied from any benchmark case."""
from __future__ import annotations

import sys

import pytest

from trainops.agents import diagnose as answer
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.reliability.causes import diagnose
from trainops.tools.reliability.evidence import Evidence, inert
from trainops.tools.reliability.interruptions import read_interruptions
from trainops.tools.reliability.signature_match import match_lines, ranked, split_lines

pytestmark = pytest.mark.usefixtures("as_operator")


def _diagnosed(log: str, **fields):
    hits = ranked(match_lines(split_lines(log), clean=inert))
    return diagnose(Evidence(state=fields.pop("state", "failed"), exit_code=1, signatures=hits, **fields))


# --- a cancel line without a reason is not 'planned' ------------------------------------------------
STEP_CANCELLED = "slurmstepd: error: *** STEP 812.0 ON node-a7 CANCELLED AT 2025-03-02T08:11:40 ***"


@pytest.mark.parametrize("tail", ["srun: error: node-a7: task 0: Terminated\nsrun: Force Terminated StepId=812.0",
                                  "srun: error: node-a7: task 1: Exited with exit code 1"])
def test_a_cancel_line_that_names_no_reason_is_not_a_planned_end_and_offers_no_requeue(tail):
    d = _diagnosed(f"epoch 3: 40%|####      | 4/10 [05:00<07:30]\n{STEP_CANCELLED}\n{tail}\n")
    assert d.cause != "planned" and d.requeue_helps is not True, d
    assert "requeue" not in d.next_step.lower(), d.next_step
    assert "sacct" in d.reason or "scheduler's job state" in d.reason, d.reason


def test_only_the_schedulers_own_state_makes_a_reasonless_cancel_a_preemption():
    d = _diagnosed(STEP_CANCELLED, reason="PREEMPTED: preempted by a higher-priority job")
    assert (d.cause, d.sub_cause, d.requeue_helps) == ("planned", "preemption", True)


def test_the_answer_to_a_reasonless_cancel_offers_no_requeue():
    d = _diagnosed(f"{STEP_CANCELLED}\nsrun: error: node-a7: task 0: Terminated\n")
    record = {"id": "i1", "job_id": "77", "cause": d.cause, "sub_cause": d.sub_cause, "cause_reason": d.reason,
              "next_step": d.next_step, "requeue_helps": d.requeue_helps, "confidence": d.confidence,
              "quote": d.quote, "evidence": {"error_lines": []}}
    text = " ".join(answer._from_record(record, None, True).get("next_to_collect", []))
    assert "requeue_job" not in text and "requeueing" not in text, text


# --- a rank waiting in the store is a hung peer, not the exception it raises ---------------------------
@pytest.mark.parametrize("line", [
    "RuntimeError: [3] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d key-value "
    "store by key '0', but store->get('0') got error",
    "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. 3/4 clients joined.",
    "RuntimeError: Wait timeout after 600000ms, keys: /default_pg/0//cuda//0",
])
def test_a_rank_waiting_in_the_c10d_store_is_a_hung_peer_not_software(line):
    log = ("Traceback (most recent call last):\n  File \"train.py\", line 40, in main\n"
           "    torch.distributed.barrier()\n" + line + "\n")
    d = _diagnosed(log)
    assert d.cause == "hung-peer" and d.sub_cause in ("store-wait", "collective-timeout"), d
    assert d.requeue_helps is False and d.quote == line, d


# --- an unannounced SIGKILL is a host-memory hint ------------------------------------------------------
@pytest.mark.parametrize("line", [
    "Killed",
    "/bin/bash: line 12:  4242 Killed                  python train.py",
    "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 1 (pid: 5150) of binary: "
    "/usr/bin/python3",
])
def test_a_sigkill_with_no_sender_named_is_a_low_confidence_host_memory_hint(line):
    d = _diagnosed(f"epoch 5/5 loss 2.1\n{line}\n")
    assert (d.cause, d.confidence, d.quote) == ("host-memory", "low", line), d
    assert d.requeue_helps is False and "kernel log" in d.next_step, d


def test_a_specific_line_outranks_the_sigkill_hint():
    d = _diagnosed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\nKilled\n")
    assert d.cause == "gpu-memory", d


# --- NCCL's result codes ---------------------------------------------------------------------------
def test_nccls_argument_check_is_a_software_error_quoting_the_warn_line():
    warn = "host1:77:91 [0] misc/argcheck.cc:39 NCCL WARN AllGather : invalid type 11"
    log = (f"host1:77:91 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>\n{warn}\n"
           "host1:77:91 [0] NCCL INFO enqueue.cc:300 -> 4\n"
           "terminate called after throwing an instance of 'std::runtime_error'\n"
           "  what():  NCCL Error 4: invalid argument\nAborted (core dumped)\n")
    d = _diagnosed(log)
    assert (d.cause, d.sub_cause, d.quote) == ("software", "nccl-invalid-usage", warn), d
    assert d.requeue_helps is False


def test_nccls_system_error_trace_is_the_network_family_never_high():
    log = ("host1:77:91 [0] NCCL INFO Channel 00/0 : 0[1000] -> 1[1000] [send] via NET/Socket/0\n"
           "host1:77:92 [0] NCCL INFO transport/net_socket.cc:401 -> 2\n"
           "host1:77:92 [0] NCCL INFO transport/net.cc:612 -> 2\n")
    d = _diagnosed(log)
    assert (d.cause, d.sub_cause, d.confidence) == ("network", "nccl-system-error", "medium"), d
    assert "-> 2" in d.quote


def test_a_channel_line_with_an_arrow_between_ranks_is_not_a_result_code():
    assert not match_lines(["host1:77:91 [0] NCCL INFO Channel 02/0 : 0[1000] -> 1[1000] via P2P/IPC"])


# --- storage: the checkpoint writer cannot open its file; errno 28 spellings ----------------------------
@pytest.mark.parametrize("line", ["RuntimeError: File out/ckpt/step_800.pt cannot be opened.",
                                  "OSError: [Errno 28] No space left on device: '/scratch/ckpt'",
                                  "RuntimeError: [enforce fail at inline_container.cc:595] . unexpected pos 12 vs 4",
                                  "IOError: write failed, errno=28 (ENOSPC)"])
def test_a_checkpoint_write_that_fails_is_storage_not_a_python_exception(line):
    log = ("Traceback (most recent call last):\n  File \"train.py\", line 88, in save\n"
           "    torch.save(state, path)\n" + line + "\n")
    d = _diagnosed(log)
    assert d.cause == "storage" and d.quote == line and d.requeue_helps is False, d


# --- NaN / inf loss in each framework's spelling -------------------------------------------------------
@pytest.mark.parametrize("line", [
    "step 900 | lr 0.0031 | total_loss: nan | box_loss: 1.2",
    "Epoch 3/10 - 1s - loss: nan - accuracy: 0.1000",
    "{'train_loss': nan, 'epoch': 2}",
    "FloatingPointError: Loss became infinite or NaN at iteration=4410!",
    "tensorflow.python.framework.errors_impl.InvalidArgumentError: loss : Tensor had NaN values",
    "RuntimeError: Function 'LogSoftmaxBackward0' returned nan values in its 0th output.",
    "ERROR:tensorflow:Model diverged with loss = NaN.",
])
def test_a_nan_or_inf_loss_is_data_in_every_frameworks_spelling(line):
    d = _diagnosed(f"step 899 | loss: 2.31\n{line}\n")
    assert (d.cause, d.sub_cause) == ("data", "nan-loss") and d.quote == line, d
    assert d.requeue_helps is False


@pytest.mark.parametrize("line", ["loss_scale: inf | loss: 2.3", "step 10 | loss: 1.2 | grad_norm: nan",
                                  "inference loss: 0.7"])
def test_a_finite_loss_or_a_loss_scale_is_not_a_nan_loss(line):
    assert not any(h.name == "nan-loss" for h in match_lines([line])), line


# --- the command path: a posted log run as a job -------------------------------------------------------
def test_a_job_whose_rank_waited_in_the_store_is_recorded_a_hung_peer_without_a_requeue(workspace):
    workspace.mkdir(parents=True, exist_ok=True)
    log = workspace / "posted.log"
    log.write_text("Traceback (most recent call last):\n    torch.distributed.barrier()\n"
                   "RuntimeError: [2] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d "
                   "key-value store by key '0', but store->get('0') got error\n")
    script = f"print(open({str(log)!r}).read()); raise SystemExit(1)"
    job = call("submit_job", {"spec": {"name": "store-wait", "command": [sys.executable, "-c", script]}},
               CallContext(actor="operator")).handle.job_id
    call("wait_job", {"job_id": job, "timeout_s": 60}, CallContext(actor="operator"))
    rec = read_interruptions(job)[-1]
    assert (rec.cause, rec.sub_cause, rec.requeue_helps) == ("hung-peer", "store-wait", False)
    assert "retrieving ncclUniqueId" in rec.quote


def test_nccls_invalid_usage_code_gives_way_to_the_line_that_names_the_reason():
    log = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, invalid usage (run with "
           "NCCL_DEBUG=WARN for details), NCCL version 2.19.3\nncclInvalidUsage: This usually reflects invalid usage "
           "of NCCL library.\nLast error:\nDuplicate GPU detected : rank 2 and rank 3 both on CUDA device 41000\n")
    d = _diagnosed(log)
    assert (d.cause, d.sub_cause) == ("configuration", "parallel-size") and "Duplicate GPU" in d.quote, d


# --- a job that ended while one rank's progress bar stood at the default collective timeout -------------
def _bar(elapsed: str) -> str:
    return f"Building index: 52%|#####     | 52/100 [{elapsed}<27:40, 31.9s/it]"


@pytest.mark.parametrize("elapsed", ["29:41", "10:02"])
def test_a_job_ended_with_its_last_progress_bar_at_the_default_timeout_is_a_low_hung_peer_hint(elapsed):
    d = _diagnosed("\n".join([_bar("12:00"), _bar(elapsed), STEP_CANCELLED]))
    assert (d.cause, d.sub_cause, d.confidence) == ("hung-peer", "rank-busy-at-timeout", "low"), d
    assert d.requeue_helps is False and elapsed in d.quote
    assert "no line names the rank that waited" in d.reason and "unnamed" not in d.reason, d.reason


@pytest.mark.parametrize("elapsed", ["44:10", "03:15"])
def test_a_progress_bar_that_went_past_the_timeout_or_ended_early_is_no_evidence(elapsed):
    hits = match_lines(split_lines("\n".join([_bar("29:41"), _bar(elapsed)])))
    assert not any(h.name == "progress-at-timeout" for h in hits)
