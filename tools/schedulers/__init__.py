"""Job schedulers behind one protocol: `local` (embedded default), `slurm`, `kubernetes`.

`get_scheduler(kind)` is the one way to pick a backend; it lives here, above the backends, which
import only the contract (`base`). A caller that brings its own scheduler puts it in through
`trainops.tools.backends.backends`, the one seam, never here."""
from __future__ import annotations

import os
from pathlib import Path
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
from trainops.workspace import jobs_dir

__all__ = [
    "JobHandle",
    "JobSpec",
    "JobState",
    "JobStatus",
    "NodeInfo",
    "Scheduler",
    "SchedulerError",
    "get_scheduler",
    "session_kinds",
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


def session_kinds() -> list[str]:
    """The scheduler kinds this session uses, in the order to ask them: local always; Slurm where a
    cluster is configured (SLURM_CONF, /etc/slurm/slurm.conf) or this workspace launched Slurm jobs;
    Kubernetes where a kubeconfig is named (KUBECONFIG) or trainops runs in a pod. A kind that is not
    configured is never asked: its client would wait out a timeout on every request. Inside a
    `backends` block, every kind: the injected provider decides what serves each."""
    if injected().scheduler is not None:
        return list(get_args(SchedulerKind))
    slurm = (os.environ.get("SLURM_CONF") or Path("/etc/slurm/slurm.conf").is_file()
             or any(jobs_dir().glob("slurm-*.json")))
    kubernetes = os.environ.get("KUBECONFIG") or os.environ.get("KUBERNETES_SERVICE_HOST")
    return ["local", *(["slurm"] if slurm else []), *(["kubernetes"] if kubernetes else [])]
