"""A node agent: the supervisor of a node other than the leader's (trainops.trainer.supervisor,
`--node-index` above 0). It starts its node's workers, beats `beat/NODE` into the leader's store,
reports their exits (`exit/W`) and carries out the leader's kills (`kill/W`); cut off from the
leader, or declared lost by it (`fenced/NODE`), it stops its workers (fencing)."""
from __future__ import annotations

import json
import socket
import sys
import time
from datetime import timedelta

from trainops.trainer.workers import JOIN_TIMEOUT_S, secured, signal_workers, start_workers

BEAT_S = 0.1
FENCE_S = 3.0
"""An agent whose call to the leader's store fails (closed: the leader is gone), or hangs this long
(a partition), stops its workers: a cut-off node must not train on beside the ranks that replaced it."""


def connect(address: str, timeout_s: float = JOIN_TIMEOUT_S):
    """A client of the leader's store, waiting for the leader to open it (nodes start in any order)."""
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))


class NodeAgent:
    """Another node's supervisor: starts this node's workers, beats, reports their exits and carries
    out the leader's kills; stops them all when the leader declares this node lost or cannot be
    reached (FENCE_S), and leaves once the leader says the job is over."""

    def __init__(self, node: int, count: int, program: list[str], store_address: str, secret: str):
        self.node = node
        self.store = secured(connect(store_address), secret)
        self.store.set_timeout(timedelta(seconds=FENCE_S))  # a partitioned link fails a call instead of blocking it
        self.workers = start_workers(program, store_address, node, count, secret)
        self.reported: set[int] = set()
        self.store.set(f"agent/{node}", json.dumps({"host": socket.gethostname(), "workers": [
            {"index": w.index, "pid": w.pid} for w in self.workers]}))

    def run(self) -> int:
        while True:
            try:
                self.store.set(f"beat/{self.node}", str(time.time()))
                for worker in self.workers:
                    if worker.index not in self.reported and (code := worker.process.poll()) is not None:
                        self.store.set(f"exit/{worker.index}", str(code))
                        self.reported.add(worker.index)
                    if self.store.check([f"kill/{worker.index}"]):
                        worker.process.kill()
                if self.store.check([f"fenced/{self.node}"]):
                    return self._stop_all("the leader declared this node lost")
                if self.store.check(["shutdown"]) and len(self.reported) == len(self.workers):
                    self.store.set(f"bye/{self.node}", "1")
                    return 0
            except (RuntimeError, OSError) as error:  # closed (the leader is gone) or silent past FENCE_S (a partition)
                return self._stop_all(f"the leader's store is unreachable ({type(error).__name__})")
            time.sleep(BEAT_S)

    def _stop_all(self, why: str) -> int:
        """Fenced: every worker of this node stops; 1, since the job did not end here as it should."""
        alive = [w for w in self.workers if w.process.poll() is None]
        print(f"supervisor (node {self.node}): {why}: stopping {len(alive)} running worker(s)", file=sys.stderr,
              flush=True)
        for worker in alive:
            worker.process.kill()
        for worker in self.workers:
            worker.process.wait()
        return 1

    def terminate(self, signum: int) -> None:
        signal_workers(self.workers, signum)
