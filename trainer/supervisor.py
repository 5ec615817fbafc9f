"""The in-process-restart launcher: trainops' own small supervisor in torchrun's place.

torchrun ends every worker when one fails; this one keeps the survivors. It starts the ranks
and `--warm-spares` spare workers at once (each imports torch and the trainer, then waits: see
trainops.trainer.inprocess), holds the TCPStore they meet in, and watches them. When a rank's
process exits, or a survivor reports that its collective broke, it waits a short grace for the
other ranks to leave the broken group, kills any that did not (a hung rank), admits a spare with
the dead rank's rank in a new group generation, and lets the job continue from its newest
verified checkpoint. Each recovery appends a RecoveryEntry to RUN/recoveries.jsonl once the first
step after it is done, sealed with the run's key trainops launched it with (trainops/record_keys.py:
the ranks never get the key, so a line a job writes there is not read). What it cannot recover (no
spare left, every rank failing alike, the leader's own node lost) ends it non-zero, so the
scheduler's requeue takes over.

Across nodes (a Slurm job: one supervisor per node, `--node-index`), node 0's supervisor leads: it
holds the store and decides; every other node's supervisor is that node's agent (node_agent.py),
starting its workers (workers.py), beating `beat/NODE` into the store, reporting their exits
(`exit/W`) and carrying out kills (`kill/W`). `--spare-nodes` trailing nodes hold only warm spares
(the hot-spare pool's nodes, allocated with the job), so a lost node's ranks move onto a spare
node's processes instead of waiting for a requeue. An agent whose beats stop is a lost node; an
agent that cannot reach the leader, or that the leader declared lost (`fenced/NODE`), stops its
workers (fencing).

    python -m trainops.trainer.supervisor --nproc-per-node N --warm-spares S --collective-timeout-s T
        [--restore-timeout-s R] [--nnodes M --node-index I --spare-nodes K --store HOST:PORT] --run-dir RUN
        -- -m trainops.trainer.inprocess --run-dir RUN
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from trainops.record_keys import ENV_KEYS_DIR, RECORD_KEY_ENV, run_key
from trainops.run_folder import RunFiles
from trainops.run_records import LostRank, RecoveryEntry, read_faults, read_heartbeat, read_journal
from trainops.trainer.config import RESTORE_TIMEOUT_S
from trainops.trainer.node_agent import NodeAgent
from trainops.trainer.workers import JOIN_TIMEOUT_S, Worker, secured, signal_workers, start_workers, store_secret

POLL_S = 0.05
GRACE_S = 2.0
"""After the first sign of a failure, how long the other ranks get to leave the broken group on
their own (a dead peer's closed connections fail their collectives within milliseconds; peers of a
hung rank all reach the same bounded timeout together); a rank still inside after it is hung."""
NODE_SILENT_S = 1.0
"""A node whose agent's beat has not changed for this long (on the leader's clock) is lost: its
ranks are replaced without waiting for the scheduler (Slurm's SlurmdTimeout is seconds more)."""


@dataclass
class Recovery:
    """A recovery under way, until the first step after it is done."""

    generation: int
    failed_ranks: list[int]
    trigger: str
    fault_time: float
    detected: float
    aborted: float = 0.0
    admitted_at: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    lost: list[LostRank] = field(default_factory=list)
    beats: dict[int, float] = field(default_factory=dict)
    lost_nodes: list[str] = field(default_factory=list)
    admitted: dict[int, str] = field(default_factory=dict)



class Supervisor:
    """Node 0's supervisor: the store, the ranks' assignment and every recovery."""

    def __init__(self, run_dir: Path, nproc: int, spares: int, timeout_s: float, program: list[str], *,
                 nnodes: int = 1, spare_nodes: int = 0, store_address: str | None = None,
                 restore_timeout_s: float = RESTORE_TIMEOUT_S, record_key: bytes = b""):
        import torch.distributed as dist

        self.run_dir, self.nproc, self.timeout_s, self.record_key = run_dir, nproc, timeout_s, record_key
        self.restore_timeout_s = max(restore_timeout_s, timeout_s)
        self.nnodes, self.world = nnodes, nproc * nnodes
        host, _, port = (store_address or "127.0.0.1:0").rpartition(":")
        listener = dist.TCPStore(host if store_address is None else "0.0.0.0", int(port), is_master=True,
                                 wait_for_workers=False, timeout=timedelta(seconds=30))
        self.port = listener.port
        secret = store_secret(record_key, nnodes + spare_nodes)
        self.store = secured(listener, secret)
        self.generation = 0
        self.workers = start_workers(program, f"{host}:{self.port}", 0, nproc + spares, secret)
        self.lost_nodes: set[int] = set()
        self._beats: dict[int, tuple[str, float]] = {}
        for worker in self.workers:
            self._note_worker(worker, "started", store_port=self.port)
        self._join_agents(range(1, nnodes + spare_nodes))
        self.ranks: dict[int, Worker] = {}
        self.generation_started = time.time()
        for node in range(nnodes):
            for local, worker in enumerate([w for w in self.workers if w.node == node][:nproc]):
                self._give(worker, node * nproc + local)
        self._send_assignments()

    def _join_agents(self, nodes: range) -> None:
        """Wait for every other node's agent to register its workers."""
        deadline = time.time() + JOIN_TIMEOUT_S
        for node in nodes:
            while (raw := self._key(f"agent/{node}")) is None:
                if time.time() > deadline:
                    self._finish(1)
                    raise SystemExit(f"supervisor: node {node}'s supervisor did not join within "
                                     f"{JOIN_TIMEOUT_S:.0f} s; read its step's log")
                time.sleep(POLL_S)
            agent = json.loads(raw)
            self._beats[node] = ("", time.monotonic())
            for entry in agent["workers"]:
                worker = Worker(entry["index"], entry["pid"], node, agent["host"])
                self.workers.append(worker)
                self._note_worker(worker, "started", store_port=self.port)

    def _note_worker(self, worker: Worker, event: str, **detail) -> None:
        """RUN/workers.jsonl: which process holds which rank, on which host, when (a drill's and a
        test's evidence that a spare, not a new process, took a rank)."""
        with RunFiles(self.run_dir).workers.open("a") as fh:
            fh.write(json.dumps({"time": time.time(), "worker": worker.index, "pid": worker.pid, "host": worker.host,
                                 "event": event, **detail}) + "\n")

    def _give(self, worker: Worker, rank: int) -> None:
        worker.rank = rank
        self.ranks[rank] = worker

    def _send_assignments(self) -> None:
        """Every rank's assignment for this generation; a rank's local rank is its place among the
        ranks its node holds (the device it would own on a GPU node)."""
        for rank, worker in sorted(self.ranks.items()):
            mates = sorted(r for r, w in self.ranks.items() if w.node == worker.node)
            job = {"rank": rank, "world_size": self.world, "generation": self.generation, "timeout_s": self.timeout_s,
                   "restore_timeout_s": self.restore_timeout_s, "local_rank": mates.index(rank),
                   "local_world_size": len(mates), "node": worker.node}
            self.store.set(f"assign/{worker.index}/{worker.assignments}", json.dumps(job))
            worker.assignments += 1
            self._note_worker(worker, "assigned", rank=rank, generation=self.generation)

    def _stop(self, worker: Worker) -> None:
        self.store.set(f"assign/{worker.index}/{worker.assignments}", "stop")
        worker.assignments += 1

    def _key(self, key: str) -> str | None:
        return self.store.get(key).decode() if self.store.check([key]) else None

    # --- a worker, wherever it runs ---------------------------------------------------------------

    def _exit_code(self, worker: Worker) -> int | None:
        if worker.process is not None:
            return worker.process.poll()
        raw = self._key(f"exit/{worker.index}")
        return int(raw) if raw is not None else None

    def _gone(self, worker: Worker) -> bool:
        return worker.node in self.lost_nodes or self._exit_code(worker) is not None

    def _kill(self, worker: Worker) -> None:
        if worker.process is not None:
            worker.process.kill()
        else:
            self.store.set(f"kill/{worker.index}", "1")

    def _reap(self, worker: Worker, timeout_s: float = 30.0) -> None:
        if worker.process is not None:
            try:
                worker.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            return
        deadline = time.time() + timeout_s
        while not self._gone(worker) and time.time() < deadline:
            self._watch_nodes()
            time.sleep(POLL_S)

    def _watch_nodes(self) -> None:
        """Mark a node lost whose agent's beat stopped changing; fence it, should it still run."""
        now = time.monotonic()
        for node, (seen, since) in self._beats.items():
            if node in self.lost_nodes:
                continue
            beat = self._key(f"beat/{node}") or ""
            if beat != seen:
                self._beats[node] = (beat, now)
            elif now - since > NODE_SILENT_S:
                self.lost_nodes.add(node)
                self.store.set(f"fenced/{node}", "1")

    def spares(self) -> list[Worker]:
        return [w for w in self.workers if w.rank is None and not self._gone(w)]

    def _note_ready(self) -> None:
        """Note each worker's `imported` time (torch and the trainer loaded) once it reports it."""
        for worker in self.workers:
            if not worker.ready and (ready := self._key(f"ready/{worker.index}")) is not None:
                worker.ready = True
                self._note_worker(worker, "imported", imported_at=json.loads(ready)["time"])

    # --- the job ---------------------------------------------------------------------------------

    def run(self) -> int:
        recovery: Recovery | None = None
        while True:
            self._note_ready()
            self._watch_nodes()
            if recovery is not None and (first := self._key(f"first_step/{recovery.generation}")):
                self._record(recovery, json.loads(first))
                recovery = None
            done = [r for r in self.ranks if self._key(f"done/{self.generation}/{r}") is not None]
            if len(done) == self.world:
                return self._finish(0)
            trigger, failed = self._failure()
            if trigger:
                recovery = self._recover(trigger, failed)
                if recovery is None:
                    return self._finish(1)
            time.sleep(POLL_S)

    def _node_name(self, node: int) -> str:
        return next((w.host for w in self.workers if w.node == node), f"node {node}")

    def _failure(self) -> tuple[str, list[int]]:
        """What broke this generation (empty when nothing): a rank's node went silent, a rank's
        process exited without finishing, or a rank reported it left the group."""
        for rank, worker in sorted(self.ranks.items()):
            if worker.node in self.lost_nodes:
                lost = sorted(r for r, w in self.ranks.items() if w.node == worker.node)
                return (f"node {self._node_name(worker.node)} lost: its supervisor went silent "
                        f"(no beat for {NODE_SILENT_S:g} s) with rank(s) {lost}"), lost
            code = self._exit_code(worker)
            if code is not None and self._key(f"done/{self.generation}/{rank}") is None:
                return f"rank {rank} exited with code {code}", [rank]
        for rank in sorted(self.ranks):
            if (why := self._key(f"failed/{self.generation}/{rank}")) is not None:
                return f"rank {rank} left the group: {why}", []
        return "", []

    def _recover(self, trigger: str, failed: list[int]) -> Recovery | None:
        detected = time.time()
        deadline = detected + GRACE_S
        left: set[int] = set()
        while time.time() < deadline:
            self._watch_nodes()
            for rank, worker in self.ranks.items():
                if self._gone(worker) and rank not in left:
                    failed = sorted({*failed, rank})
                if self._key(f"failed/{self.generation}/{rank}") is not None:
                    left.add(rank)
            if left | set(failed) == set(self.ranks):
                break
            time.sleep(POLL_S)
        lost_nodes = sorted(self.lost_nodes & {w.node for w in self.ranks.values()})
        if lost_nodes and not trigger.startswith("node "):
            trigger += "; node(s) " + ", ".join(self._node_name(n) for n in lost_nodes) + " went silent"
        hung = sorted(set(self.ranks) - left - set(failed))
        beats = {rank: read_heartbeat(self.run_dir, rank) for rank in self.ranks}  # before a spare beats as one
        for rank in hung:  # still inside the broken collective after the grace: killed, replaced
            self._kill(self.ranks[rank])
        for rank in sorted({*failed, *hung}):
            self._reap(self.ranks[rank])
        failed = sorted({*failed, *hung})
        if hung and not trigger.startswith(tuple(f"rank {r} exited" for r in failed)):
            clock = (f"the {self.timeout_s:g} s collective timeout" if self._key(f"first_step/{self.generation}")
                     else f"the {self.restore_timeout_s:g} s restore deadline (before the generation's first step)")
            trigger = f"{trigger}; rank(s) {hung} hung past {clock}, killed"
        aborted = time.time()
        lost = [self._lost_rank(rank, beats[rank], hung) for rank in failed]
        if not failed:
            print(f"supervisor: every rank failed alike ({trigger}); not a lost rank, so no in-process restart",
                  file=sys.stderr, flush=True)
            return None
        if 0 in lost_nodes:
            print(f"supervisor: {trigger}; the leader's node is lost: ending the job for the scheduler's requeue",
                  file=sys.stderr, flush=True)
            return None
        spares = self.spares()
        if len(spares) < len(failed):
            print(f"supervisor: {trigger}; {len(failed)} rank(s) lost and {len(spares)} warm spare(s) left: "
                  "ending the job for the scheduler's requeue", file=sys.stderr, flush=True)
            return None
        fault_time = self._fault_time(failed, detected)
        self.generation += 1
        self.generation_started = time.time()
        print(f"supervisor: {trigger}; admitting spare(s) for rank(s) {failed} in generation {self.generation}",
              file=sys.stderr, flush=True)
        admitted = {}
        for rank in failed:
            old = self.ranks[rank]
            old.rank = None
            spare = min(spares, key=lambda w: self._preference(w, old))
            spares.remove(spare)
            self._give(spare, rank)
            admitted[rank] = spare.host
            self._note_worker(spare, "admitted", rank=rank, generation=self.generation)
        self._send_assignments()
        recovery = Recovery(self.generation, failed, trigger, fault_time, detected, aborted, time.time(), lost=lost,
                            beats={rank: beat.time for rank, beat in beats.items() if beat and beat.time},
                            lost_nodes=[self._node_name(n) for n in lost_nodes], admitted=admitted)
        recovery.phases = {"detect": round(detected - fault_time, 4), "abort": round(aborted - detected, 4)}
        return recovery

    def _preference(self, spare: Worker, replaced: Worker) -> tuple[bool, bool, int]:
        """A dead rank's own node first (its data is there), then a node holding no rank (a spare
        node), then any; a lost node's ranks so land together on the spare node."""
        holds_ranks = any(w.node == spare.node for w in self.ranks.values() if w.rank is not None)
        return spare.node != replaced.node or replaced.node in self.lost_nodes, holds_ranks, spare.index

    def _lost_rank(self, rank: int, beat, hung: list[int]) -> LostRank:
        worker = self.ranks[rank]
        silent = worker.node in self.lost_nodes
        return LostRank(rank=rank, pid=worker.pid, host=worker.host,
                        exit_code=None if rank in hung or silent else self._exit_code(worker),
                        last_beat=beat.time if beat else None,
                        exit_note=(f"its node {worker.host} went silent" if silent else
                                   beat.exit.error if beat and beat.exit else ""))

    def _fault_time(self, failed: list[int], detected: float) -> float:
        """When the failure began: an injected fault's own record, else the failed ranks' last heartbeat."""
        injected = [f.time for f in read_faults(self.run_dir) if f.rank in failed and f.time >= self.generation_started]
        if injected:
            return min(max(injected), detected)
        beats = [b.time for r in failed if (b := read_heartbeat(self.run_dir, r)) and b.time]
        return min(max(beats), detected) if beats else detected

    def _record(self, recovery: Recovery, first: dict) -> None:
        generation = recovery.generation
        joined = max(float(self._key(f"joined/{generation}/{r}") or recovery.admitted_at) for r in self.ranks)
        loaded = json.loads(self._key(f"loaded/{generation}") or json.dumps({"time": joined, "step": 0}))
        since = recovery.admitted_at
        checkpoint = next((e.path for e in reversed(read_journal(self.run_dir).loads) if e.time >= since), None)
        phases = {**recovery.phases, "admit": round(joined - recovery.admitted_at, 4),
                  "load": round(loaded["time"] - joined, 4), "first_step": round(first["time"] - loaded["time"], 4)}
        entry = RecoveryEntry(time=first["time"], path="spare-admitted", failed_ranks=recovery.failed_ranks,
                              trigger=recovery.trigger, generation=generation, resumed_step=loaded["step"],
                              source="storage", checkpoint=checkpoint, phases_s=phases,
                              total_s=round(first["time"] - recovery.detected, 4), lost=recovery.lost,
                              beats=recovery.beats, host=socket.gethostname(), lost_nodes=recovery.lost_nodes,
                              admitted_on=recovery.admitted)
        if self.record_key:  # trainops launched this supervisor: its readers take only sealed records
            entry = entry.sealed(self.record_key)
        with RunFiles(self.run_dir).recoveries.open("a") as fh:
            fh.write(entry.model_dump_json() + "\n")

    def _finish(self, code: int) -> int:
        """Stop the spares (and, on failure, every rank), reap every worker on every node, then tell
        the agents to go and close the store."""
        for worker in self.workers:
            if not self._gone(worker):
                if code == 0 and worker.rank is None:
                    self._stop(worker)
                elif code != 0:
                    self._kill(worker)
        for worker in self.workers:
            self._reap(worker)
        self.store.set("shutdown", str(code))
        deadline = time.time() + 5  # each live agent says goodbye before the store closes under it
        for node in set(self._beats) - self.lost_nodes:
            while self._key(f"bye/{node}") is None and time.time() < deadline:
                time.sleep(POLL_S)
        return code

    def terminate(self, signum: int) -> None:
        signal_workers(self.workers, signum)


def _take_record_key() -> bytes:
    """The run's key trainops put in this process's environment (trainops/record_keys.py), taken out
    of it before any worker starts: the ranks never inherit it. b"" when launched without one."""
    try:
        return bytes.fromhex(os.environ.pop(RECORD_KEY_ENV, ""))
    except ValueError:
        return b""


def _hand_launch_key(run_dir: str, nodes: int) -> bytes:
    """The run's key for supervisors started across nodes without one (by hand, not by a trainops
    launch): derived from the workspace's own key, which nodes sharing the keys folder read alike, so
    the store keeps a secret. On one node none is needed: the workers are this process's children."""
    if nodes == 1:
        return b""
    if (key := run_key(run_dir, create=True)) is None:
        raise SystemExit(f"a supervisor across {nodes} nodes needs the run's key: launch the job through trainops "
                         f"(submit_job), or let every node read this workspace's key ({ENV_KEYS_DIR} writable and "
                         "shared by the nodes)")
    return key


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    record_key = _take_record_key()
    if "--" not in argv:
        sys.stderr.write(__doc__ or "")
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(description="in-process-restart launcher")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--warm-spares", type=int, default=1)
    parser.add_argument("--collective-timeout-s", type=float, default=60.0)
    parser.add_argument("--restore-timeout-s", type=float, default=RESTORE_TIMEOUT_S,
                        help="a generation's join, checkpoint load and first step (at least the collective timeout)")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes holding ranks")
    parser.add_argument("--spare-nodes", type=int, default=0, help="trailing nodes holding only warm spares")
    parser.add_argument("--node-index", type=int, default=0, help="this node's place in the job's node list")
    parser.add_argument("--store", default=None, help="HOST:PORT of node 0's store (across nodes)")
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv[:split])
    program = argv[split + 1:]
    if args.node_index and args.store is None:
        parser.error("--node-index above 0 needs --store HOST:PORT (node 0's address)")
    record_key = record_key or _hand_launch_key(args.run_dir, args.nnodes + args.spare_nodes)
    if args.node_index:
        count = args.nproc_per_node + (args.warm_spares if args.node_index < args.nnodes else 0)
        launcher: Supervisor | NodeAgent = NodeAgent(args.node_index, count, program, args.store,
                                                     store_secret(record_key, args.nnodes + args.spare_nodes))
    else:
        launcher = Supervisor(Path(args.run_dir), args.nproc_per_node, args.warm_spares, args.collective_timeout_s,
                              program, nnodes=args.nnodes, spare_nodes=args.spare_nodes, store_address=args.store,
                              restore_timeout_s=args.restore_timeout_s, record_key=record_key)

    def on_signal(signum: int, frame) -> None:
        launcher.terminate(signum)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return launcher.run()


if __name__ == "__main__":
    sys.exit(main())
