"""A node's worker processes for an in-process-restart job: the leader's supervisor and every
node agent start them the same way and address them by one index unique across the job's nodes.
Ranks and warm spares are the same processes: the leader's assignment says which is which."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass

JOIN_TIMEOUT_S = 120.0
SLOTS = 1000
"""Worker indices are NODE * SLOTS + local slot, unique across the job's nodes."""


@dataclass
class Worker:
    index: int
    pid: int
    node: int = 0
    host: str = ""
    process: subprocess.Popen | None = None
    """The leader's own children; None for a worker another node's agent started."""
    assignments: int = 0
    rank: int | None = None
    ready: bool = False


def start_workers(program: list[str], store_address: str, node: int, count: int) -> list[Worker]:
    """This node's workers (ranks and spares alike: the leader says which is which)."""
    host, _, port = store_address.rpartition(":")
    env = {**os.environ, "TRAINOPS_INPROCESS_STORE": store_address, "MASTER_ADDR": host, "MASTER_PORT": port}
    workers = []
    for slot in range(count):
        index = node * SLOTS + slot
        process = subprocess.Popen([sys.executable, *program], env={**env, "TRAINOPS_INPROCESS_WORKER": str(index)})
        workers.append(Worker(index, process.pid, node, socket.gethostname(), process))
    return workers


def signal_workers(workers: list[Worker], signum: int) -> None:
    """Pass the scheduler's signal to this node's own workers, then reap them."""
    local = [w.process for w in workers if w.process is not None]
    for process in local:
        if process.poll() is None:
            process.send_signal(signum)
    for process in local:
        process.wait()
