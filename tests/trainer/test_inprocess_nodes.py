"""In-process restart across nodes: one supervisor per node (node 0 leads, the others are agents),
a trailing spare node of warm spares, and a lost node whose ranks move onto the spare node's
processes instead of the job ending. The nodes here are process groups on one host, each started
with the command line a Slurm job step runs (`supervisor_argv`); the sandbox cluster test
(tests/integration/test_multinode.py) runs the same through Slurm on namespace nodes."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import free_port, wait_for
from tests.trainer.test_inprocess_restart import BASE, OPERATOR, by_step, workers
from trainops.record_keys import RECORD_KEY_ENV
from trainops.run_records import RECOVERY_PHASES, read_heartbeat, read_journal, read_recoveries
from trainops.tools.jobs.follow import run_local
from trainops.trainer.config import load_config
from trainops.trainer.launch import prepare_run, record_key_env, supervisor_argv, trainer_program
from trainops.trainer.workers import SLOTS

STEPS = ["training.steps=24"]
NODES = ["resilience.in_process_restart=true", "resilience.collective_timeout_s=4", "resilience.spare_nodes=1",
         "resilience.warm_spares=0"]


class Nodes(list):
    """The node processes start_nodes started, and the store address they share."""
    store: str


def start_nodes(run_dir, nnodes: int, with_key: bool = True) -> Nodes:
    """Node 0's supervisor and every other node's agent, each in its own session (a node's processes);
    `with_key`: each handed the run's key as a launch does, else started as by hand."""
    cfg = load_config(run_dir / "config.toml")
    nodes = Nodes()
    nodes.store = f"127.0.0.1:{free_port()}"
    for index in range(nnodes + cfg.resilience.spare_nodes):
        argv = supervisor_argv(sys.executable, 1, trainer_program(run_dir), cfg.resilience, nnodes=nnodes,
                               node_index=str(index), store=nodes.store)
        log = open(run_dir / "logs" / f"node{index}.log", "a")
        env = {k: v for k, v in os.environ.items() if k != RECORD_KEY_ENV}
        env.update(record_key_env(argv) if with_key else {})
        nodes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env))
    return nodes


@pytest.mark.slow
def test_a_lost_node_moves_its_ranks_onto_the_spare_nodes_warm_processes_and_the_run_matches():
    reference = run_local(load_config(None, "tiny", BASE + STEPS), 2, run_id="nodes-reference", ctx=OPERATOR,
                          timeout_s=300)
    assert reference.status == "ok"
    run_dir = prepare_run(load_config(None, "tiny", BASE + STEPS + NODES), run_id="nodes-restarted")
    leader, lost, spare = start_nodes(run_dir, nnodes=2)
    try:
        wait_for(lambda: (beat := read_heartbeat(run_dir, 1)) is not None and beat.step >= 4
                 and bool(read_journal(run_dir).saves), 120, "rank 1 past step 4 with a checkpoint")
        node_pids = [lost.pid, *(c.pid for c in psutil.Process(lost.pid).children(recursive=True))]
        os.killpg(lost.pid, signal.SIGKILL)  # the node is gone: its agent and its rank at once
        assert leader.wait(timeout=180) == 0
        assert lost.wait(timeout=10) == -signal.SIGKILL
        assert spare.wait(timeout=30) == 0  # the spare node's agent leaves once the job is done
    finally:
        for node in (leader, lost, spare):
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)

    [recovery] = read_recoveries(run_dir)
    assert recovery.path == "spare-admitted" and recovery.failed_ranks == [1]
    assert "went silent" in recovery.trigger  # a survivor often sees the broken pair first, then the silence
    assert recovery.lost_nodes and recovery.lost[0].exit_code is None and "went silent" in recovery.lost[0].exit_note
    assert set(recovery.phases_s) == set(RECOVERY_PHASES)
    assert recovery.phases_s["abort"] < 3.0  # the node is declared lost by its silent beat, not a 4 s timeout

    events = workers(run_dir)
    [admitted] = [e for e in events if e["event"] == "admitted"]
    assert admitted["rank"] == 1 and admitted["worker"] // SLOTS == 2  # a process of the spare node took rank 1
    assert read_heartbeat(run_dir, 1).pid == admitted["pid"]
    rank0 = {e["pid"] for e in events if e["event"] == "assigned" and e["rank"] == 0}
    assert len(rank0) == 1  # rank 0 kept its process across the restart

    for rank in range(2):  # the resume is exact: the same loss and grad norm at every step
        assert by_step(run_dir, rank) == by_step(reference.run_dir, rank)
    alive = [p for p in {e["pid"] for e in events} | set(node_pids)
             if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


def test_a_node_whose_leader_is_gone_stops_its_workers():
    """Fencing: an agent that cannot reach node 0's store stops its own workers instead of leaving
    them to train on (or to wait forever) beside the ranks that replaced them."""
    run_dir = prepare_run(load_config(None, "tiny", BASE + STEPS + NODES), run_id="nodes-fenced")
    leader, node1, spare = start_nodes(run_dir, nnodes=2)
    try:
        wait_for(lambda: (run_dir / "workers.jsonl").exists()
                 and sum(e["event"] == "imported" for e in workers(run_dir)) == 3, 120, "every worker imported")
        os.killpg(leader.pid, signal.SIGKILL)
        started = time.monotonic()
        assert node1.wait(timeout=30) == 1 and spare.wait(timeout=30) == 1
        assert time.monotonic() - started < 10
    finally:
        for node in (leader, node1, spare):
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    log = (run_dir / "logs" / "node1.log").read_text()
    assert "the leader's store is unreachable" in log
    pids = {e["pid"] for e in workers(run_dir)}
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
