"""The in-process-restart launcher: trainops' own small supervisor in torchrun's place.

torchrun ends every worker when one fails; this one keeps the survivors. It starts the ranks
and `--warm-spares` spare workers at once (each imports torch and the trainer, then waits: see
trainops.trainer.inprocess), holds the TCPStore they meet in, and watches them. When a rank's
process exits, or a survivor reports that its collective broke, it waits a short grace for the
other ranks to leave the broken group, kills any that did not (a hung rank: its own child, by the
Popen it holds), admits a spare with the dead rank's rank in a new group generation, and lets the
job continue from its newest verified checkpoint. Each recovery appends a RecoveryEntry to
RUN/recoveries.jsonl once the first step after it is done. What it cannot recover (no spare
left, every rank failing alike) ends it non-zero, so the scheduler's requeue takes over.

    python -m trainops.trainer.supervisor --nproc-per-node N --warm-spares S --collective-timeout-s T
        --run-dir RUN -- -m trainops.trainer.inprocess --run-dir RUN
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

from trainops.run_folder import LostRank, RecoveryEntry, RunFiles, read_faults, read_heartbeat, read_journal

POLL_S = 0.05
GRACE_S = 2.0
"""After the first sign of a failure, how long the other ranks get to leave the broken group on
their own (a dead peer's closed connections fail their collectives within milliseconds; peers of a
hung rank all reach the same bounded timeout together); a rank still inside after it is hung."""


@dataclass
class Worker:
    index: int
    process: subprocess.Popen
    assignments: int = 0
    rank: int | None = None
    ready: bool = False


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


class Supervisor:
    def __init__(self, run_dir: Path, nproc: int, spares: int, timeout_s: float, program: list[str]):
        import torch.distributed as dist

        self.run_dir, self.nproc, self.timeout_s = run_dir, nproc, timeout_s
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=30))
        self.generation = 0
        self.workers: list[Worker] = []
        env = {**os.environ, "TRAINOPS_INPROCESS_STORE": f"127.0.0.1:{self.store.port}",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.store.port)}
        for index in range(nproc + spares):
            process = subprocess.Popen([sys.executable, *program], env={**env, "TRAINOPS_INPROCESS_WORKER": str(index)})
            self.workers.append(Worker(index, process))
            self._note_worker(index, process.pid, "started", store_port=self.store.port)
        self.ranks: dict[int, Worker] = {}
        self.generation_started = time.time()
        for rank in range(nproc):
            self._assign(self.workers[rank], rank)

    def _note_worker(self, index: int, pid: int, event: str, **detail) -> None:
        """RUN/workers.jsonl: which process holds which rank, when (a drill's and a test's evidence
        that a spare, not a new process, took a rank)."""
        with RunFiles(self.run_dir).workers.open("a") as fh:
            fh.write(json.dumps({"time": time.time(), "worker": index, "pid": pid, "event": event, **detail}) + "\n")

    def _assign(self, worker: Worker, rank: int) -> None:
        worker.rank = rank
        self.ranks[rank] = worker
        job = {"rank": rank, "world_size": self.nproc, "generation": self.generation, "timeout_s": self.timeout_s}
        self.store.set(f"assign/{worker.index}/{worker.assignments}", json.dumps(job))
        worker.assignments += 1
        self._note_worker(worker.index, worker.process.pid, "assigned", rank=rank, generation=self.generation)

    def _stop(self, worker: Worker) -> None:
        self.store.set(f"assign/{worker.index}/{worker.assignments}", "stop")
        worker.assignments += 1

    def _key(self, key: str) -> str | None:
        return self.store.get(key).decode() if self.store.check([key]) else None

    def spares(self) -> list[Worker]:
        return [w for w in self.workers if w.rank is None and w.process.poll() is None]

    def _note_ready(self) -> None:
        """Note each worker's `imported` time (torch and the trainer loaded) once it reports it."""
        for worker in self.workers:
            if not worker.ready and (ready := self._key(f"ready/{worker.index}")) is not None:
                worker.ready = True
                self._note_worker(worker.index, worker.process.pid, "imported", imported_at=json.loads(ready)["time"])

    def run(self) -> int:
        recovery: Recovery | None = None
        while True:
            self._note_ready()
            if recovery is not None and (first := self._key(f"first_step/{recovery.generation}")):
                self._record(recovery, json.loads(first))
                recovery = None
            done = [r for r in self.ranks if self._key(f"done/{self.generation}/{r}") is not None]
            if len(done) == self.nproc:
                return self._finish(0)
            trigger, failed = self._failure()
            if trigger:
                recovery = self._recover(trigger, failed)
                if recovery is None:
                    return self._finish(1)
            time.sleep(POLL_S)

    def _failure(self) -> tuple[str, list[int]]:
        """What broke this generation (empty when nothing): a rank's process exited without
        finishing, or a rank reported it left the group."""
        for rank, worker in sorted(self.ranks.items()):
            code = worker.process.poll()
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
            for rank, worker in self.ranks.items():
                if worker.process.poll() is not None and rank not in left:
                    failed = sorted({*failed, rank})
                if self._key(f"failed/{self.generation}/{rank}") is not None:
                    left.add(rank)
            if left | set(failed) == set(self.ranks):
                break
            time.sleep(POLL_S)
        hung = sorted(set(self.ranks) - left - set(failed))
        beats = {rank: read_heartbeat(self.run_dir, rank) for rank in self.ranks}  # before a spare beats as one
        for rank in hung:  # still inside the broken collective after the grace: killed, replaced
            self.ranks[rank].process.kill()
        for rank in sorted({*failed, *hung}):
            self.ranks[rank].process.wait()
        failed = sorted({*failed, *hung})
        if hung and not trigger.startswith(tuple(f"rank {r} exited" for r in failed)):
            trigger = f"{trigger}; rank(s) {hung} hung past the {self.timeout_s:g} s collective timeout, killed"
        aborted = time.time()
        lost = [LostRank(rank=rank, pid=self.ranks[rank].process.pid, exit_code=None if rank in hung else
                         self.ranks[rank].process.returncode, last_beat=beats[rank].time if beats[rank] else None,
                         exit_note=beats[rank].exit.error if beats[rank] and beats[rank].exit else "")
                for rank in failed]
        if not failed:
            print(f"supervisor: every rank failed alike ({trigger}); not a lost rank, so no in-process restart",
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
        for rank in sorted(self.ranks):
            worker = self.ranks[rank]
            if rank in failed:
                worker.rank = None
                worker = spares.pop(0)
                self._note_worker(worker.index, worker.process.pid, "admitted", rank=rank, generation=self.generation)
            self._assign(worker, rank)
        recovery = Recovery(self.generation, failed, trigger, fault_time, detected, aborted, time.time(), lost=lost,
                            beats={rank: beat.time for rank, beat in beats.items() if beat and beat.time})
        recovery.phases = {"detect": round(detected - fault_time, 4), "abort": round(aborted - detected, 4)}
        return recovery

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
                              beats=recovery.beats, host=socket.gethostname())
        with RunFiles(self.run_dir).recoveries.open("a") as fh:
            fh.write(entry.model_dump_json() + "\n")

    def _finish(self, code: int) -> int:
        """Stop the spares (and, on failure, every rank), reap every child, close the store."""
        for worker in self.workers:
            if worker.process.poll() is None:
                if code == 0 and worker.rank is None:
                    self._stop(worker)
                elif code != 0:
                    worker.process.kill()
        for worker in self.workers:
            try:
                worker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
        return code

    def terminate(self, signum: int) -> None:
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signum)
        for worker in self.workers:
            worker.process.wait()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        sys.stderr.write(__doc__ or "")
        return 2
    split = argv.index("--")
    parser = argparse.ArgumentParser(description="in-process-restart launcher")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--warm-spares", type=int, default=1)
    parser.add_argument("--collective-timeout-s", type=float, default=60.0)
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv[:split])
    supervisor = Supervisor(Path(args.run_dir), args.nproc_per_node, args.warm_spares, args.collective_timeout_s,
                            argv[split + 1:])

    def on_signal(signum: int, frame) -> None:
        supervisor.terminate(signum)
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
