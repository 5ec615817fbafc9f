"""A CUDA out-of-memory end names what to change with this job's own figures: the device's size, what
was free and what the step asked for (PyTorch's own line, in either of its wordings), and the run's
recipe (its micro-batch, sequence length, activation checkpointing) with the value to try. Every
figure is the job's text, so each is bounded, and a figure out of bounds is left out, not quoted."""
from __future__ import annotations

import sys

import pytest

from trainops.run_folder import new_run_folder
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.reliability.interruptions import read_interruptions
from trainops.tools.reliability.oom_advice import device_figures, recipe_of

pytestmark = pytest.mark.usefixtures("as_operator")

OLD = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; "
       "14.52 GiB already allocated; 3.19 MiB free; 14.73 GiB reserved in total by PyTorch)")
NEW = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total capacity of "
       "79.15 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB memory in use.")
RECIPE = "[training]\nmicro_batch = 8\nseq_len = 4096\nglobal_batch = 64\nactivation_checkpointing = \"none\"\n"


def test_both_of_pytorchs_wordings_give_the_device_size_the_free_memory_and_the_ask():
    old, new = device_figures(OLD), device_figures(NEW)
    assert (old.device, old.total_gib, old.free_gib, old.asked_gib) == (0, 15.78, pytest.approx(3.19 / 1024),
                                                                         pytest.approx(20 / 1024))
    assert (new.device, new.total_gib, new.free_gib, new.asked_gib) == (3, 79.15, 1.02, 2.0)
    assert "79.15 GiB" in new.text() and "GPU 3" in new.text() and "2.00 GiB" in new.text()


def test_a_figure_out_of_bounds_is_left_out_not_quoted():
    huge = "CUDA out of memory. Tried to allocate 9e999 GiB (GPU 99999999999; 1e300 GiB total capacity; 3 GiB free)"
    figures = device_figures(huge)
    assert figures.asked_gib is None and figures.total_gib is None and figures.device is None
    assert figures.free_gib == 3.0 and "e300" not in figures.text() and "inf" not in figures.text()
    assert device_figures("CUDA out of memory").text() == ""


def test_the_recipe_is_read_bounded_from_the_run_folder_and_garbage_is_ignored(workspace):
    run = new_run_folder(RECIPE)
    assert recipe_of(run) == {"micro_batch": 8, "seq_len": 4096, "global_batch": 64,
                              "activation_checkpointing": "none"}
    odd = new_run_folder("[training]\nmicro_batch = -3\nseq_len = \"4096; rm -rf /\"\n"
                         "activation_checkpointing = \"# heading\"\n")
    assert recipe_of(odd) == {}
    assert recipe_of(new_run_folder("not toml at all [[[")) == {}
    assert recipe_of(None) == {}


def test_an_oom_job_is_told_the_device_size_and_the_micro_batch_to_try(workspace):
    workspace.mkdir(parents=True, exist_ok=True)
    run = new_run_folder(RECIPE)
    script = f"print({NEW!r}); raise SystemExit(1)"
    spec = {"name": "oom-job", "command": [sys.executable, "-c", script], "run_dir": str(run)}
    job = call("submit_job", {"spec": spec}, CallContext(actor="operator")).handle.job_id
    call("wait_job", {"job_id": job, "timeout_s": 60}, CallContext(actor="operator"))
    rec = read_interruptions(job)[-1]
    assert (rec.cause, rec.sub_cause) == ("gpu-memory", "oom"), rec.cause_reason
    assert "79.15 GiB" in rec.next_step and "1.02 GiB" in rec.next_step and "2.00 GiB" in rec.next_step
    assert "micro_batch 8" in rec.next_step and "training.micro_batch=4" in rec.next_step
    assert "activation_checkpointing" in rec.next_step


def test_at_micro_batch_one_the_advice_is_not_to_halve_it(workspace):
    run = new_run_folder(RECIPE.replace("micro_batch = 8", "micro_batch = 1"))
    script = f"print({OLD!r}); raise SystemExit(1)"
    spec = {"name": "oom-one", "command": [sys.executable, "-c", script], "run_dir": str(run)}
    job = call("submit_job", {"spec": spec}, CallContext(actor="operator")).handle.job_id
    call("wait_job", {"job_id": job, "timeout_s": 60}, CallContext(actor="operator"))
    rec = read_interruptions(job)[-1]
    assert "training.micro_batch=0" not in rec.next_step and "micro_batch 1" in rec.next_step
    assert "training.seq_len=2048" in rec.next_step and "15.78 GiB" in rec.next_step
    assert "3.19 MiB of it was free" in rec.next_step and "20.00 MiB more" in rec.next_step
