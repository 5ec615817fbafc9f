"""Which forked rank ended first, and with what code, as the kernel saw it (trainer/warm_launch.py).

torch's elastic agent reports one failure for ranks forked as functions: the first failed process its
poll finds, and after a crash the peers fail within the same 0.1 s poll, so it named rank 0's "exit 1"
(a broken connection) instead of the crashed rank 1's exit 42. trainops reads that report for the
failing rank (tools/reliability/evidence.py). So the launcher watches its children with pidfds: each
becomes readable the moment its process ends, and `waitid(..., WNOWAIT)` reads the status without
reaping it (torch still reaps). The failure report is then rebuilt in torchrun's own format, every
failed rank listed, the first to end as the root cause."""
from __future__ import annotations

import os
import select
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from trainops.trainer.launch import rank_in_name

POLL_S = 0.2
"""How often new children are looked for (a rank that ends sooner is left to torch's report); an end is
seen at once, its pidfd turning readable."""


@dataclass(frozen=True)
class RankExit:
    rank: int
    pid: int
    exitcode: int  # negative: the signal that killed it, as torch reports one
    at: float  # time.time() when the kernel showed it ended


def _rank_of(pid: int) -> int | None:
    """The global rank a forked rank wrote into its kernel name (readable while it is a zombie)."""
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None
    return rank_in_name(name)


def _children() -> set[int]:
    """This process's children, as the kernel lists them per thread (no scan of /proc)."""
    found = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            found.update(int(pid) for pid in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return found


class ExitWatch(threading.Thread):
    """Records each forked rank's end (rank, pid, exit code, time) in the order the kernel shows them."""

    def __init__(self) -> None:
        super().__init__(name="trainops-rank-exits", daemon=True)
        self.exits: list[RankExit] = []
        self._fds: dict[int, int] = {}  # pidfd -> pid
        self._seen: set[int] = set()
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            for pid in _children() - self._seen:
                self._seen.add(pid)
                try:
                    self._fds[os.pidfd_open(pid)] = pid
                except OSError:
                    continue  # already reaped
            ready, _, _ = select.select(list(self._fds), [], [], POLL_S) if self._fds else ([], [], [])
            if not self._fds:
                time.sleep(POLL_S)
            for fd in ready:
                self._record(fd, self._fds.pop(fd))

    def _record(self, fd: int, pid: int) -> None:
        try:
            status = os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOWAIT)
            rank = _rank_of(pid)
        except ChildProcessError:
            status, rank = None, None  # torch reaped it first: its own report covers it
        finally:
            os.close(fd)
        if status is not None and rank is not None:
            code = status.si_status if status.si_code == os.CLD_EXITED else -status.si_status
            self.exits.append(RankExit(rank, pid, code, time.time()))

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=1.0)

    def first_failures(self, failed: ChildFailedError) -> ChildFailedError:
        """torch's report rebuilt from what the kernel showed: every rank that failed, the first to end first."""
        torch_rank, torch_failure = failed.get_first_failure()
        offset = torch_rank - torch_failure.local_rank  # this node's first global rank
        failures: dict[int, ProcessFailure] = {}
        for end in sorted(self.exits, key=lambda e: e.at):
            if end.exitcode != 0 and end.rank not in failures:
                failure = ProcessFailure(local_rank=end.rank - offset, pid=end.pid, exitcode=end.exitcode,
                                         error_file="")
                failure.timestamp = int(end.at)
                failures[end.rank] = failure
        return ChildFailedError(failed.name, failures) if failures else failed
