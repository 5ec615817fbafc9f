"""Text families a class covered from one source's wording and missed from another's (issue 44
items 1, 2, 4, 5), one mechanism each: a scheduler's cancel line that names no reason is not a
planned end (only the scheduler's own state says preemption or cancel), a rank waiting in the c10d
store for the rank that publishes the NCCL id is a hung peer, not the exception it raises, an
unannounced SIGKILL of a training process is a host-memory hint, NCCL's own result codes (its
argument checks, its `file:line -> N` trace), a checkpoint writer that cannot open its file, and a
NaN/inf loss in every framework's spelling; then Slurm's memory enforcement, c10d's rendezvous port
in use, a loss scale halved below 1, gloo's missing interface, IB completion errors, ranks that
called different collectives, a wrapped exception message quoted whole, and a scheduler's end the
log goes on past (no requeue). Logs are written from each source's message format, not copied
from any benchmark case."""
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
def _recorded(workspace, name: str, text: str):
    workspace.mkdir(parents=True, exist_ok=True)
    log = workspace / f"{name}.log"
    log.write_text(text)
    script = f"print(open({str(log)!r}).read()); raise SystemExit(1)"
    job = call("submit_job", {"spec": {"name": name, "command": [sys.executable, "-c", script]}},
               CallContext(actor="operator")).handle.job_id
    call("wait_job", {"job_id": job, "timeout_s": 60}, CallContext(actor="operator"))
    return read_interruptions(job)[-1]


def test_a_job_whose_rank_waited_in_the_store_is_recorded_a_hung_peer_without_a_requeue(workspace):
    rec = _recorded(workspace, "store-wait", "Traceback (most recent call last):\n    torch.distributed.barrier()\n"
                    "RuntimeError: [2] is setting up NCCL communicator and retrieving ncclUniqueId from [0] via c10d "
                    "key-value store by key '0', but store->get('0') got error\n")
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


# --- the scheduler's memory enforcement: Slurm's own lines ------------------------------------------
@pytest.mark.parametrize("line", [
    "slurmstepd: error: StepId=4411.0 exceeded memory limit (9126805504 > 8589934592), being killed",
    "slurmstepd: error: Job 5120 exceeded virtual memory limit (40213504 > 33554432), being killed",
    "slurmstepd: error: Exceeded step memory limit",
    "srun: error: gpu-n12: task 3: Out Of Memory",
])
def test_slurms_memory_enforcement_is_host_memory_not_a_reasonless_cancel(line):
    d = _diagnosed(f"epoch 2 | step 400 | loss 1.92\n{line}\n{STEP_CANCELLED}\n")
    assert d.cause == "host-memory" and d.quote == line and d.requeue_helps is False, d


def test_a_memory_cgroup_that_reached_its_limit_at_some_point_is_only_a_hint():
    d = _diagnosed("slurmstepd: error: Exceeded job memory limit at some point.\n")
    assert (d.cause, d.confidence) == ("host-memory", "low"), d


# --- the rendezvous port: c10d's own verdict and errno EADDRINUSE --------------------------------------
def test_c10d_that_could_not_listen_anywhere_is_a_port_in_use_quoting_its_verdict():
    verdict = "[E socket.cpp:500] [c10d] The server socket has failed to listen on any local network address."
    log = "\n".join(["[W socket.cpp:436] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - "
                     "Address already in use).",
                     "[W socket.cpp:436] [c10d] The server socket has failed to bind to 0.0.0.0:29500 (errno: 98 - "
                     "Address already in use).", verdict])
    d = _diagnosed(log)
    assert (d.cause, d.sub_cause, d.quote) == ("configuration", "rendezvous-port", verdict), d
    assert d.requeue_helps is False and "port" in d.next_step


@pytest.mark.parametrize("line,confidence", [
    ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
     "port: 29500, useIpv6: False, code: -98, name: EADDRINUSE, message: address already in use", "high"),
    ("RuntimeError: Address already in use", "low"),
])
def test_a_port_in_use_is_configuration_in_each_torch_releases_wording(line, confidence):
    d = _diagnosed(f"Traceback (most recent call last):\n{line}\n")
    assert (d.cause, d.confidence) == ("configuration", confidence), d


def test_an_address_family_warning_is_no_port_in_use():
    line = "[W socket.cpp:663] [c10d] The server socket cannot be initialized on [::]:29500 (errno: 97 - Address " \
           "family not supported by protocol)."
    assert not any(h.cause == "configuration" for h in match_lines([line]))


# --- a loss scale that kept falling below 1 -------------------------------------------------------------
@pytest.mark.parametrize("line", [
    "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1.52587890625e-05",
    "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 1, reducing to 0.5",
    "Found NaN, decreased lg_loss_scale to -3.0",
])
def test_a_loss_scale_halved_below_one_is_a_divergence_outranking_the_nan_rows(line):
    d = _diagnosed(f"| loss     | nan      |\n| grad_norm | nan     |\n{line}\n")
    assert (d.cause, d.sub_cause, d.quote) == ("data", "fp16-overflow", line), d
    assert d.requeue_helps is False and "bf16" in d.next_step


def test_a_loss_scale_still_above_one_is_the_routine_overflow_hint():
    log = "\n".join(f"Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to {2.0 ** k}"
                    for k in range(15, 11, -1))
    d = _diagnosed(log)
    assert (d.cause, d.confidence) == ("data", "low"), d


def test_a_logger_tables_nan_loss_row_is_a_nan_loss():
    d = _diagnosed("-------------------\n| loss | nan |\n| step | 1.2e+04 |\n")
    assert (d.cause, d.sub_cause) == ("data", "nan-loss") and "nan" in d.quote, d


# --- a network interface that does not exist on the host; IB completion errors ---------------------------
def test_gloo_that_cannot_find_its_interface_is_network_and_names_the_mpi_tagged_rank():
    line = ("[1,3]<stderr>:RuntimeError: [enforce fail at ../third_party/gloo/gloo/transport/tcp/device.cc:83] "
            "ifa != nullptr. Unable to find address for: ib0")
    hits = ranked(match_lines([line], clean=inert))
    assert hits[0].name == "gloo-interface-missing" and hits[0].rank == 3
    d = _diagnosed(line)
    assert (d.cause, d.sub_cause, d.requeue_helps) == ("network", "socket-interface", False), d


@pytest.mark.parametrize("warn", [
    "gpu-a1:811:902 [3] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion from peer 10.0.4.7<41233> with "
    "error 12, opcode 0, len 0, vendor err 129 (Recv)",
    "gpu-a1:811:902 [3] transport/net_ib.cc:2453 NCCL WARN NET/IB: Got completion from peer 10.0.4.7<41233> with "
    "status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_RECV(128) vendor_err=129 hca mlx5_1",
])
def test_an_ib_completion_error_is_infiniband_quoting_the_warn_over_its_trace(warn):
    d = _diagnosed(f"{warn}\ngpu-a1:811:902 [3] NCCL INFO transport/net.cc:1302 -> 6\n"
                   "gpu-a1:811:902 [3] NCCL INFO proxy.cc:698 -> 6\n")
    assert (d.cause, d.sub_cause, d.quote, d.confidence) == ("network", "infiniband", warn, "medium"), d


def test_nccls_trace_quotes_the_warn_line_that_started_it():
    warn = "gpu-a1:811:902 [3] NCCL WARN Net : Connection closed by remote peer 10.0.4.7<41233>"
    d = _diagnosed(f"{warn}\ngpu-a1:811:902 [3] NCCL INFO transport/net_socket.cc:541 -> 6\n")
    assert (d.cause, d.quote) == ("network", warn), d


# --- ranks that called different collectives ---------------------------------------------------------
@pytest.mark.parametrize("line", [
    "RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=41, OpType=ALLREDUCE), but Rank 1 is running collective: "
    "CollectiveFingerPrint(SequenceNumber=41, OpType=BROADCAST).",
    "RuntimeError: Detected at least one rank that exhausted inputs. Throwing across all ranks.",
])
def test_ranks_that_called_different_collectives_are_software_outranking_the_timeout(line):
    watchdog = ("[rank1]:[E ProcessGroupNCCL.cpp:563] [Rank 1] Watchdog caught collective operation timeout: "
                "WorkNCCL(SeqNum=41, OpType=ALLREDUCE) ran for 600042 milliseconds before timing out.")
    d = _diagnosed(f"{watchdog}\n{line}\n")
    assert (d.cause, d.sub_cause, d.quote, d.requeue_helps) == ("software", "collective-desync", line, False), d


# --- an exception message wrapped over lines is quoted from its exception line ---------------------------
def test_a_wrapped_exception_message_is_quoted_from_its_exception_line():
    first = "AssertionError: Check the batch sizes given in the config. global_batch is not"
    d = _diagnosed(f"{first}\nequal to micro_batch * accumulation * world_size 96 != 4 *\n8 * 2\n")
    assert d.cause == "configuration" and d.quote.startswith(first) and "96 != 4" in d.quote, d


def test_a_short_exception_line_is_no_wrapped_message():
    log = "RuntimeError: worker 3 failed\nrank 3: world_size 8 != 4 devices\n"
    assert _diagnosed(log).quote == "rank 3: world_size 8 != 4 devices"


# --- a scheduler's end that the log goes on past --------------------------------------------------------
PREEMPTED = "slurmstepd: error: *** JOB 9071 ON node-b2 CANCELLED AT 2025-04-11T03:00:12 DUE TO PREEMPTION ***"


def test_a_preemption_the_log_goes_on_past_and_fails_offers_no_requeue():
    d = _diagnosed(f"{PREEMPTED}\nslurmstepd: error: Failed to send MESSAGE_TASK_EXIT: Connection refused\n"
                   "Traceback (most recent call last):\n  File \"train.py\", line 12, in <module>\n"
                   "ValueError: optimizer state has 16 groups, expected 8\n")
    assert (d.cause, d.requeue_helps) == ("planned", False), d
    assert "ValueError" in d.reason and "a requeue meets it again" in d.next_step, d


def test_a_preemption_followed_only_by_its_teardown_and_signal_report_still_is_a_requeue():
    d = _diagnosed(f"{PREEMPTED}\nsrun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
                   "Traceback (most recent call last):\n"
                   "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4411 got signal: 15\n")
    assert (d.cause, d.sub_cause) == ("planned", "preemption") and d.requeue_helps is not False, d
    assert "requeue from the last good checkpoint" in d.next_step


# --- the same, through the command path --------------------------------------------------------------
def test_a_job_slurm_killed_for_memory_is_recorded_host_memory_without_a_requeue(workspace):
    line = "slurmstepd: error: Job 5120 exceeded memory limit (9126805504 > 8589934592), being killed"
    rec = _recorded(workspace, "mem-limit", f"step 90 | loss 2.2\n{line}\n{STEP_CANCELLED}\n")
    assert (rec.cause, rec.sub_cause, rec.requeue_helps, rec.quote) == ("host-memory", "job-memory-limit", False,
                                                                         line)


def test_a_job_that_failed_after_its_preemption_line_is_recorded_without_a_requeue(workspace):
    rec = _recorded(workspace, "preempt-then-fail", f"{PREEMPTED}\nTraceback (most recent call last):\n"
                    "ValueError: optimizer state has 16 groups, expected 8\n")
    assert (rec.cause, rec.requeue_helps) == ("planned", False)
    text = " ".join(answer._from_record(rec.model_dump(mode="json"), None, True).get("next_to_collect", []))
    assert "requeue_job" not in text and "requeue from" not in text, text
