"""Job schedulers behind one protocol: `local` (embedded default), `slurm`, `kubernetes`."""
from trainops.tools.schedulers.base import (
    JobHandle,
    JobSpec,
    JobState,
    JobStatus,
    NodeInfo,
    Scheduler,
    SchedulerError,
    get_scheduler,
)

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
