"""A node's worker processes for an in-process-restart job: the leader's supervisor and every
node agent start them the same way and address them by one index unique across the job's nodes.
Ranks and warm spares are the same processes: the leader's assignment says which is which."""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import subprocess
import sys
from dataclasses import dataclass

JOIN_TIMEOUT_S = 120.0
STORE_SECRET_ENV = "TRAINOPS_STORE_SECRET"
"""The job's store namespace, in its workers' environment only (a process of another user cannot read it
from /proc). torch's TCPStore listens on every address and asks no one who they are: every key the
supervisor, its agents and its workers use sits under this secret, so a client without it reads nothing
of theirs and writes nothing they read (no `failed/G/R` to set off a recovery, no assignment to take)."""
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


def store_secret(record_key: bytes, nodes: int) -> str:
    """The job's store namespace: derived from the run's key every node's supervisor holds, so each
    node's agent derives the same one; without a key, a random one on a single node (the workers are
    the supervisor's children). Across nodes a supervisor always has the key (supervisor.main)."""
    if record_key:
        return hmac.new(record_key, b"trainops supervisor store", hashlib.sha256).hexdigest()[:32]
    if nodes > 1:
        raise ValueError(f"a store shared by {nodes} nodes needs the run's key to derive its secret")
    return secrets.token_hex(16)


def secured(store, secret: str):
    """`store` seen under the job's secret namespace (itself when there is none)."""
    import torch.distributed as dist

    return dist.PrefixStore(secret, store) if secret else store


def start_workers(program: list[str], store_address: str, node: int, count: int, secret: str = "") -> list[Worker]:
    """This node's workers (ranks and spares alike: the leader says which is which)."""
    host, _, port = store_address.rpartition(":")
    env = {**os.environ, "TRAINOPS_INPROCESS_STORE": store_address, "MASTER_ADDR": host, "MASTER_PORT": port,
           STORE_SECRET_ENV: secret}
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
