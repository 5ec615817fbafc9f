"""A drill's restart (S5), the part that is the same whatever the fault: drain the node the detector
blames where a hot spare can take its place, then check that the checkpoint the requeued job loaded
is the newest good one (the async writer lost nothing it had committed), and what the restart
found. The phases that use these, in order, are `trainops.skills.drill.drill`'s; the waits between them
are `trainops.skills.drill.waits`'. Every step that changes the world is a tool call, so it passes
the gate as the drill's caller."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from trainops.run_records import LoadEntry, read_journal
from trainops.tools.calls import invoke
from trainops.tools.context import CallContext
from trainops.tools.jobs import jobs
from trainops.tools.reliability import checkpoints
from trainops.tools.reliability.signals import Detection


class Restart(BaseModel):
    """What isolating the fault and restarting the job found."""
    job_id: str = Field(description="the requeued job")
    drained: str | None
    quarantined: list[int]
    isolated_at: float
    first_step_at: float
    loaded: LoadEntry | None = Field(description="the checkpoint the restart loaded; None: it started from step 0")
    intact: bool
    fell_back: list[int] = Field(description="corrupt checkpoints the restart's checksum check skipped")
    started_at: float | None = Field(description="the requeued job's start, as the scheduler recorded it")


def isolate_node(detection: Detection, job_nodes: list[str], scheduler: str,
                 ctx: CallContext | None = None, partition: str | None = None) -> str | None:
    """Drain the faulty node when the scheduler has another idle node to restart on (a hot
    spare; with `partition`, one of that partition, where the requeued job can run); with no spare the
    restart reuses the node. Only one of `job_nodes` (the drilled job's nodes as the scheduler names
    them) is drained: the detector's node may come from a host the job wrote into its heartbeat or
    metrics. Returns the drained node, if any; the drill resumes it afterwards."""
    if detection.isolation != "node" or detection.node not in job_nodes:
        return None
    nodes = invoke(jobs.list_nodes, jobs.SchedulerRef(scheduler=scheduler), ctx).nodes
    if not any(n.name != detection.node and n.state == "idle" and (partition is None or partition in n.partitions)
               for n in nodes):
        return None
    invoke(jobs.drain_node, jobs.DrainNodeInput(node=detection.node, scheduler=scheduler,
                                                reason="trainops fault drill"), ctx)
    return detection.node


def verify_restored(run_dir: str, used: LoadEntry | None, ctx: CallContext | None = None,
                    excluded: set[int] = frozenset()) -> bool:
    """The restart loaded a committed checkpoint (`used`; None: it started from step 0) that
    verified (by the trainer as it loaded, else here), and no newer committed save was skipped over
    unless it failed verification or was quarantined (`excluded`): the async writer lost nothing it
    had committed."""
    if used is None:
        return False
    # verified: checked at the moment of loading; keep-N may have pruned it since
    complete = used.verified or (Path(used.path).exists() and invoke(
        checkpoints.verify_checkpoint, checkpoints.VerifyCheckpointInput(path=used.path), ctx).complete)
    journal = read_journal(run_dir)
    skipped = {e.step for e in journal.fallbacks} | set(excluded)
    newer = [e for e in journal.saves if e.step > used.step and e.time < used.time and e.step not in skipped]
    return complete and not newer
