"""Job schedulers behind one protocol: `local` (embedded default), `slurm`, `kubernetes`.

`get_scheduler(kind)` is the one way to pick a backend; it lives here, above the backends, which
import only the contract (`base`). A caller that brings its own scheduler puts it in through
`trainops.tools.backends.backends`, the one seam, never here."""
from __future__ import annotations

from typing import get_args

from trainops.tools.backends import injected
from trainops.tools.schedulers.base import (
    JobHandle,
    JobSpec,
    JobState,
    JobStatus,
    NodeInfo,
    Scheduler,
    SchedulerError,
    SchedulerKind,
)
from trainops.tools.schedulers.kubernetes import KubernetesScheduler
from trainops.tools.schedulers.local import LocalScheduler
from trainops.tools.schedulers.slurm import SlurmScheduler

__all__ = [
    "JobHandle",
    "JobSpec",
    "JobState",
    "JobStatus",
    "NodeInfo",
    "Scheduler",
    "SchedulerError",
    "get_scheduler",
]


def get_scheduler(kind: str) -> Scheduler:
    """The backend for `kind`; heavy clients are imported only here. Inside a `backends(scheduler=...)`
    block (trainops.tools.backends) the injected provider serves every kind."""
    if (provider := injected().scheduler) is not None:
        return provider(kind)
    if kind == "local":
        return LocalScheduler()
    if kind == "slurm":
        return SlurmScheduler()
    if kind == "kubernetes":
        return KubernetesScheduler()
    raise SchedulerError(kind, f"unknown scheduler {kind!r}: use one of {', '.join(get_args(SchedulerKind))}")
