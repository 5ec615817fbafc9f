"""In-process restart onto warm spares (trainops.trainer.supervisor), through the command path a
job takes: `run_local` -> the local scheduler -> torchrun_argv, which hands a single-node run
with `resilience.in_process_restart` to the supervisor. A restarted run must match an
uninterrupted one step for step, the replacement must be a spare started with the job, and
nothing of the job may outlive it."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import leaked_shm_segments, shm_segments
from trainops.run_records import RECOVERY_PHASES, read_faults, read_heartbeat, read_metrics, read_recoveries
from trainops.tools.context import CallContext
from trainops.tools.jobs.follow import run_local
from trainops.trainer.config import load_config
from trainops.trainer.launch import WARM_LAUNCHER, local_gpus, prepare_run, torchrun_argv, trainer_program

BASE = ["model.n_layers=2", "training.seq_len=32", "training.global_batch=8", "training.micro_batch=2",
        "training.steps=6", "checkpoint.enable=true", "checkpoint.interval=2"]
IN_PROCESS = ["resilience.in_process_restart=true", "resilience.collective_timeout_s=4"]
OPERATOR = CallContext(actor="operator")


def workers(run_dir: str | Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "workers.jsonl").read_text().splitlines()]


def by_step(run_dir: str | Path, rank: int) -> dict[int, tuple[float, float]]:
    """step -> (loss, grad norm) of `rank`, the last record of each step (a restart repeats steps)."""
    return {r.step: (r.loss, r.grad_norm) for r in read_metrics(run_dir) if r.rank == rank}


def assert_nothing_left(run_dir: str | Path, shm_before: set[str]) -> None:
    """No process of the job, no shared-memory buffer, no listening store port outlives it."""
    events = workers(run_dir)
    pids = {e["pid"] for e in events}
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], f"job processes still alive: {alive}"
    deadline = time.monotonic() + 10  # the local runner writes status.json, then its exit file, then ends
    while (left := [p.info for p in psutil.process_iter(["pid", "cmdline"])
                    if str(run_dir) in " ".join(p.info["cmdline"] or [])]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []
    assert leaked_shm_segments(shm_before) == set()
    port = next(e["store_port"] for e in events if e["event"] == "started")
    listening = {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert port not in listening


def test_torchrun_argv_hands_an_in_process_run_to_the_supervisor(tmp_path):
    on = prepare_run(load_config(None, "tiny", IN_PROCESS + ["resilience.warm_spares=2"]), run_id="on")
    off = prepare_run(load_config(None, "tiny", ["resilience.in_process_restart=false"]), run_id="off")
    argv = torchrun_argv(sys.executable, 2, trainer_program(on))
    assert argv[1:3] == ["-m", "trainops.trainer.supervisor"] and argv[argv.index("--warm-spares") + 1] == "2"
    assert argv[argv.index("--restore-timeout-s") + 1] == "600"  # joining and restoring are not the 4 s hang clock
    assert argv[argv.index("--") + 1:] == ["-m", "trainops.trainer.inprocess", "--run-dir", str(on)]  # the worker
    assert WARM_LAUNCHER in torchrun_argv(sys.executable, 2, trainer_program(off))
    assert WARM_LAUNCHER in torchrun_argv(sys.executable, 1, trainer_program(on))  # one rank: nothing to keep
    multi = torchrun_argv(sys.executable, 2, trainer_program(on), nnodes=2, rdzv_endpoint="node0:29500")
    assert WARM_LAUNCHER in multi  # across nodes a lost node is the requeue's


@pytest.mark.parametrize("setting, ranks, gpus_here, spare_nodes, on", [
    ("auto", 2, 2, 0, True),      # a GPU per rank: the spare waits on the CPU and costs the ranks nothing
    ("auto", 4, 2, 0, False),     # ranks without a GPU of their own run on cores a spare's start-up would take
    ("auto", 2, 0, 0, False),     # a CPU-only host
    ("auto", 2, None, 0, False),  # a batch script written away from the nodes: nothing known of them
    ("auto", 2, None, 1, True),   # a spare node allocated for it
    ("auto", 1, 8, 1, False),     # one rank: no survivor to keep
    ("true", 2, 0, 0, True),      # asked for: on even where it costs a core
    ("false", 2, 8, 1, False),
])
def test_in_process_restart_is_on_by_default_where_a_spare_costs_the_ranks_nothing(setting, ranks, gpus_here,
                                                                                   spare_nodes, on):
    resilience = load_config(None, "tiny", [f"resilience.in_process_restart={setting}",
                                            f"resilience.spare_nodes={spare_nodes}"]).resilience
    decided, why = resilience.in_process(ranks, gpus_here)
    assert decided is on and why


def test_the_default_launch_takes_the_supervisor_exactly_where_the_host_has_a_gpu_per_rank(tmp_path, monkeypatch):
    """The same decision through the command line a local job gets, with the host's GPUs as the launch sees
    them (CUDA_VISIBLE_DEVICES narrows the device nodes; this host may have none)."""
    run = prepare_run(load_config(None, "tiny"), run_id="auto")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert local_gpus() == 0 and WARM_LAUNCHER in torchrun_argv(sys.executable, 2, trainer_program(run))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    supervised = "trainops.trainer.supervisor" in torchrun_argv(sys.executable, 2, trainer_program(run))
    assert supervised is (local_gpus() >= 2)


@pytest.mark.slow
# both data-parallel kinds and both world sizes, on the diagonal: the supervisor does not depend on the kind,
# the checkpoint restore does not depend on the world size (2-fsdp and 4-ddp added ~130 s and no path)
@pytest.mark.parametrize("nproc,data_parallel", [(2, "ddp"), (4, "fsdp")])
def test_a_crashed_rank_is_replaced_by_a_warm_spare_and_the_run_matches_an_uninterrupted_one(nproc, data_parallel):
    layout = [f"parallel.data_parallel={data_parallel}"]
    shm_before = shm_segments()
    reference = run_local(load_config(None, "tiny", BASE + layout), nproc, run_id="reference", ctx=OPERATOR,
                          timeout_s=300)
    assert reference.status == "ok"
    crash = ["faults.crash_step=4", "faults.crash_rank=1", "faults.crash_mode=sigkill"]
    restarted = run_local(load_config(None, "tiny", BASE + layout + IN_PROCESS + crash), nproc, run_id="restarted",
                          ctx=OPERATOR, timeout_s=300)
    assert restarted.status == "ok" and restarted.steps_completed == 6

    [recovery] = read_recoveries(restarted.run_dir)
    assert recovery.path == "spare-admitted" and recovery.failed_ranks == [1] and recovery.generation == 1
    assert recovery.trigger == "rank 1 exited with code -9"
    assert recovery.resumed_step == 2 and recovery.checkpoint.endswith("step-00000002")
    assert set(recovery.phases_s) == set(RECOVERY_PHASES) and all(v >= 0 for v in recovery.phases_s.values())
    assert recovery.total_s == pytest.approx(sum(v for k, v in recovery.phases_s.items() if k != "detect"), abs=0.01)

    # same loss and grad norm at every step, on every rank: the resume restores weights, optimizer,
    # schedule and data position exactly, and the ranks sum in rank order whoever holds a rank
    for rank in range(nproc):
        assert by_step(restarted.run_dir, rank) == by_step(reference.run_dir, rank)
    steps_done = [r.step for r in read_metrics(restarted.run_dir) if r.rank == 0]
    assert steps_done == [1, 2, 3, 3, 4, 5, 6]  # step 3 ran before the crash and again after the resume

    # the replacement is the spare started with the job (another pid, started before the fault), not a process
    # started for the recovery; on 2 busy cores its warm-up may still be ending when the fault comes
    events = workers(restarted.run_dir)
    [admitted] = [e for e in events if e["event"] == "admitted"]
    crashed_pid = next(e["pid"] for e in events if e["event"] == "assigned" and e["rank"] == 1)
    [fault] = read_faults(restarted.run_dir)
    started = next(e["time"] for e in events if e["event"] == "started" and e["worker"] == admitted["worker"])
    imported = next(e["imported_at"] for e in events if e["event"] == "imported" and e["worker"] == admitted["worker"])
    assert admitted["rank"] == 1 and admitted["pid"] != crashed_pid and admitted["worker"] == nproc
    assert started < fault.time and imported < recovery.time
    assert read_heartbeat(restarted.run_dir, 1).pid == admitted["pid"]
    survivors = {e["pid"] for e in events if e["event"] == "assigned" and e["rank"] != 1}
    assert len(survivors) == nproc - 1  # the other ranks kept their processes across the restart
    assert_nothing_left(restarted.run_dir, shm_before)


@pytest.mark.slow
def test_a_crash_then_a_hang_are_both_recovered_and_nothing_leaks():
    shm_before = shm_segments()
    faults = ["faults.crash_step=3", "faults.crash_rank=1", "faults.hang_step=5", "faults.hang_rank=0",
              "resilience.warm_spares=2"]
    result = run_local(load_config(None, "tiny", BASE + IN_PROCESS + faults), 2, run_id="twice", ctx=OPERATOR,
                       timeout_s=300)
    assert result.status == "ok" and result.steps_completed == 6
    first, second = read_recoveries(result.run_dir)
    assert (first.failed_ranks, first.generation, first.resumed_step) == ([1], 1, 2)
    assert (second.failed_ranks, second.generation, second.resumed_step) == ([0], 2, 4)
    assert "hung past the 4 s collective timeout" in second.trigger
    assert second.phases_s["detect"] >= 3.0  # a hang is seen once the peer's bounded collective (4 s) times out
    hung_pid = next(e["pid"] for e in workers(result.run_dir) if e["event"] == "assigned" and e["rank"] == 0)
    assert read_heartbeat(result.run_dir, 0).pid != hung_pid
    assert_nothing_left(result.run_dir, shm_before)


@pytest.mark.slow
def test_a_lost_rank_with_no_spare_left_ends_the_job_for_the_requeue():
    shm_before = shm_segments()
    faults = ["faults.crash_step=3", "faults.crash_rank=1", "resilience.warm_spares=0"]
    result = run_local(load_config(None, "tiny", BASE + IN_PROCESS + faults), 2, run_id="nospare", ctx=OPERATOR,
                       timeout_s=300)
    assert result.status == "failed" and result.exit_code != 0 and result.steps_completed == 2
    assert read_recoveries(result.run_dir) == []
    assert_nothing_left(result.run_dir, shm_before)


WARM_CHECK = r"""
import os, sys
from pathlib import Path
import torch, torch.distributed as dist
from trainops.trainer.inprocess import warm_imports
from trainops.trainer.config import load_config
from trainops.trainer.train import train

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
dist.init_process_group("gloo", rank=0, world_size=1)
warm_imports()
before = set(sys.modules)
base = ["model.n_layers=2", "training.seq_len=32", "training.global_batch=2", "training.micro_batch=2",
        "checkpoint.enable=true", "checkpoint.interval=1"]
for steps in (2, 3):  # a first run, then a resume from its checkpoint
    train(load_config(None, "tiny", base + [f"training.steps={steps}"]), Path(sys.argv[1]), 0, 1, torch.device("cpu"))
heavy = ("torch._dynamo", "torch._inductor", "sympy", "torch.distributed.fsdp", "torch.distributed.tensor",
         "torch.distributed.checkpoint", "torch.distributed.elastic", "trainops")
print(sorted(m for m in set(sys.modules) - before if m.startswith(heavy)))
"""


def test_a_warm_spare_has_already_imported_what_a_rank_imports_to_train(tmp_path):
    """A spare that is ready has imported what train() and a checkpoint resume import (a cold spare
    spent ~4.5 s of a recovery's load phase importing dynamo, sympy, FSDP and DCP): a heavy import
    added to the trainer and not to WARM_MODULES fails here."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run([sys.executable, "-c", WARM_CHECK, str(tmp_path), str(port)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
