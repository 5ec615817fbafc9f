"""Measured figures for the planners, read back from the drills' own records: the restart time of the
newest multi-node drill in the workspace (detection + isolation + requeue + checkpoint load), with
where it came from, so a plan names its evidence instead of an assumed number."""
from __future__ import annotations

from datetime import datetime, timezone

from pydantic import BaseModel, Field

from trainops.run_folder import RunFiles, read_drill_record
from trainops.tools.base import ToolError


class MeasuredRestart(BaseModel):
    detection_s: float = Field(description="Fault to detection, seconds (the drill's detection latency).")
    recovery_s: float = Field(description="Detection to the first step after the restart: isolation (drain), requeue "
                                          "onto the spare and checkpoint load, seconds.")
    total_s: float = Field(description="detection_s + recovery_s: fault to training again, seconds.")
    source: str = Field(description="The drill record the figures come from, in words.")


def newest_node_drill_restart(tool_name: str) -> MeasuredRestart:
    """From the newest drill record of a multi-node drill (one with a per-node timeline) under the
    workspace's runs; a ToolError saying how to make one when there is none."""
    from trainops.workspace import runs_dir

    records = []
    for run_dir in sorted(p for p in runs_dir().iterdir() if p.is_dir()):
        record = read_drill_record(run_dir)
        if record is not None and record.node_timeline is not None:
            records.append((record.injected_time, RunFiles(run_dir).drill_record, record))
    if not records:
        raise ToolError(tool_name, f"restart_from='newest_node_drill': no multi-node drill record under {runs_dir()}; "
                                   "run `trainops drill --scheduler slurm --nodes 2 --fault node-crash` (or partition) "
                                   "first, or give restart_s")
    when, path, record = max(records, key=lambda r: r[0])
    detection, recovery = record.detection_latency_s, record.recovery_time_s
    stamp = datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return MeasuredRestart(detection_s=detection, recovery_s=recovery, total_s=detection + recovery,
                           source=f"measured: {record.fault} drill of {stamp} ({path}): detection "
                                  f"{detection:.2f} s + isolation, requeue and load {recovery:.2f} s")
