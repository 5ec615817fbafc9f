"""Next steps that fit the cause (issue 44 item 5): what a person is told to do next comes from the
cause's class, not from each rule's wording. A deterministic cause (configuration, a shape or
vocabulary mismatch, a checkpoint from another world or TP size, GPU or host memory, storage, data,
software, a hung peer) is never answered with a requeue: the same job ends the same way; the answer
says what to change. A requeue is offered only where the end was the scheduler's plan or a node or
link trainops or the scheduler saw fail; a hardware suspicion read from the job's own text, or an
end nothing explains, gets a check or what to collect, not a spend of the same compute."""
from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from trainops.benchmarks.diagnosis.score import recommends_requeue
from trainops.cli import app
from trainops.tools.calls import call
from trainops.tools.reliability.next_steps import DETERMINISTIC, requeue_can_help
from trainops.tools.reliability.signatures import SIGNATURES

pytestmark = pytest.mark.usefixtures("as_operator")


def _answer(workspace, name: str, log: str, end: str = "raise SystemExit(1)") -> dict:
    """A real job whose output is `log` and that ends as `end` says, then `trainops ask` about it."""
    workspace.mkdir(parents=True, exist_ok=True)
    posted = workspace / f"{name}.log"
    posted.write_text(log)
    script = f"import os, signal, sys\nsys.stdout.write(open({str(posted)!r}).read())\nsys.stdout.flush()\n{end}\n"
    job = call("submit_job", {"spec": {"name": name, "command": [sys.executable, "-c", script]}}).handle.job_id
    call("wait_job", {"job_id": job, "timeout_s": 60})
    result = CliRunner().invoke(app, ["ask", f"what happened to job {job}?", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["final_answer"]


def _next(answer: dict) -> list[str]:
    return answer.get("next_to_collect") or []


def test_no_signature_of_a_deterministic_class_says_requeue():
    for sig in SIGNATURES:
        if sig.cause in DETERMINISTIC:
            assert requeue_can_help(sig.cause, sig.sub_cause, witnessed=False) is False, sig.name
            assert not recommends_requeue([sig.next_step], requeue_helps=False), (sig.name, sig.next_step)


def test_a_requeue_can_help_only_a_planned_end_or_a_witnessed_node_or_link_loss():
    assert requeue_can_help("planned", "preemption", witnessed=True) is True
    assert requeue_can_help("planned", "time-limit", witnessed=True) is True
    assert requeue_can_help("planned", "preemption", witnessed=False) is None  # the job's text: the state decides
    assert requeue_can_help("hardware", "node-failure", witnessed=True) is True
    assert requeue_can_help("network", "partition", witnessed=True) is True
    assert requeue_can_help("hardware", "ecc", witnessed=False) is False  # the node check comes first
    assert requeue_can_help("network", "infiniband", witnessed=False) is False
    for cause in DETERMINISTIC:
        assert requeue_can_help(cause, "", witnessed=True) is False, cause
    assert requeue_can_help("unclassified", "", witnessed=False) is None


def test_a_gpu_oom_says_change_the_micro_batch_and_offers_no_requeue(workspace):
    answer = _answer(workspace, "oom", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
                                       "GPU 0 has a total capacity of 79.11 GiB of which 1.2 GiB is free.\n")
    assert answer["cause_class"] == "gpu-memory"
    said = " ".join(_next(answer))
    assert "micro-batch" in said and not recommends_requeue(_next(answer), requeue_helps=False), said


def test_a_checkpoint_from_another_world_size_says_convert_it_and_offers_no_requeue(workspace):
    answer = _answer(workspace, "resume", "AssertionError: loaded checkpoint dp_world_size=16 does not match the "
                                          "current dp_world_size=8; the checkpoint was saved with another world size\n")
    assert answer["cause_class"] == "configuration", answer
    said = " ".join(_next(answer))
    assert "convert the checkpoint" in said and not recommends_requeue(_next(answer), requeue_helps=False), said


def test_an_ecc_error_from_the_jobs_own_text_asks_for_the_node_check_not_a_requeue(workspace):
    answer = _answer(workspace, "ecc", "[Rank 1] RuntimeError: CUDA error: uncorrectable ECC error encountered\n")
    assert answer["cause_class"] == "hardware"
    said = " ".join(_next(answer))
    assert "known-answer check" in said and not recommends_requeue(_next(answer), requeue_helps=False), said


def test_an_end_nothing_explains_says_what_to_collect_not_to_requeue(workspace):
    answer = _answer(workspace, "unexplained", "epoch 5 step 1200 loss 2.31\nsaving predictions\n",
                     end="os.kill(os.getpid(), signal.SIGKILL)")
    assert answer["verdict"] == "inconclusive", answer
    assert _next(answer) and not recommends_requeue(_next(answer), requeue_helps=False), _next(answer)
