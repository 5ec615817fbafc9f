"""Whether a requeue can help, from the cause's class (issue 44 item 5), in one place: every rule
and every declared signature reads it here instead of deciding it in its own wording.

A deterministic cause ends the same job the same way on the next launch: a configuration, shape,
vocabulary or parallel-size mismatch, a checkpoint from another world or TP size, GPU or host memory
the job asks for, a full disk or an unreadable checkpoint, the data, the code, a rank stuck in its
own code path. Its next step says what to change; a requeue is never offered. A requeue can help
only an end the scheduler planned (a preemption, a time limit, its own requeue) or a node
or link that trainops or the scheduler saw fail (a node down under the job, a partition, a node a
known-answer check convicted, drained first). The same words read from the job's own output are a
hypothesis: the scheduler's state or trainops' check on the node decides, not a requeue. Whether
to requeue a job someone cancelled is theirs to say: not known here."""
from __future__ import annotations

DETERMINISTIC: frozenset[str] = frozenset({"configuration", "gpu-memory", "host-memory", "storage", "data",
                                           "software", "hung-peer"})
"""Causes a plain requeue repeats."""

TRANSIENT: frozenset[tuple[str, str]] = frozenset({
    ("planned", "preemption"), ("planned", "time-limit"), ("planned", "requeue"),
    ("hardware", "node-failure"), ("hardware", "sdc"), ("network", "partition")})
"""(cause, sub-cause) ends a requeue can help once witnessed (a faulty node drained first)."""

NO_REQUEUE = "no requeue: the same job ends the same way until that changes"


def requeue_can_help(cause: str, sub_cause: str, witnessed: bool) -> bool | None:
    """True: a requeue can help; False: it cannot (or not before a check); None: not known (an end
    nothing explains, or the scheduler's words in the job's own output, which its state decides)."""
    if cause in DETERMINISTIC:
        return False
    if (cause, sub_cause) in TRANSIENT:
        return True if witnessed else None if cause == "planned" else False
    if cause in ("hardware", "network"):
        return False  # read from the job's text: the check on the node or link comes first
    return None
