"""Measured figures for the planners, read back from the drills' own records: the restart time of the
newest multi-node drill in the workspace (detection + isolation + requeue + checkpoint load), with
where it came from, so a plan names its evidence instead of an assumed number."""
from __future__ import annotations

import statistics
from datetime import datetime, timezone

from pydantic import BaseModel, Field

from trainops.run_folder import RunFiles
from trainops.run_records import read_drill_record, read_recoveries
from trainops.tools.base import ToolError
from trainops.workspace import runs_dir


class MeasuredRestart(BaseModel):
    detection_s: float = Field(description="Fault to detection, seconds (the drill's detection latency).")
    recovery_s: float = Field(description="Detection to the first step after the restart: isolation (drain), requeue "
                                          "onto the spare and checkpoint load, seconds.")
    total_s: float = Field(description="detection_s + recovery_s: fault to training again, seconds.")
    source: str = Field(description="The drill record the figures come from, in words.")


def newest_node_drill_restart(tool_name: str) -> MeasuredRestart:
    """From the newest drill record of a multi-node drill (one with a per-node timeline) under the
    workspace's runs; a ToolError saying how to make one when there is none."""
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


def measured_path_restart(path: str, tool_name: str) -> MeasuredRestart:
    """The median detection and recovery of every measured recovery by `path` under the workspace's runs:
    a drill's record (RUN/drill.json, its recovery_path) and, in a run that was no drill, each recovery
    the trainer recorded itself (RUN/recoveries.jsonl); a ToolError naming the path when none was measured."""
    drills, trainer = [], []
    for run_dir in sorted(p for p in runs_dir().iterdir() if p.is_dir()):
        record = read_drill_record(run_dir)
        if record is not None:
            if (record.model_extra or {}).get("recovery_path") == path:
                drills.append((record.detection_latency_s, record.recovery_time_s))
            continue  # a drill's own recovery is counted once, from its record
        trainer += [(entry.phases_s.get("detect"), entry.total_s)
                    for entry in read_recoveries(run_dir) if entry.path == path]
    found = drills + trainer
    if not found:
        raise ToolError(tool_name, f"restart_from='measured_path': no measured {path} recovery under {runs_dir()} (no "
                                   "drill record nor RUN/recoveries.jsonl entry of that path); run `trainops drill "
                                   "--fault crash` with the job's [resilience] settings first, or give restart_s")
    detected = [d for d, _ in found if d is not None]  # a trainer record without its detect phase tells none
    detection = statistics.median(detected) if detected else 0.0
    recovery = statistics.median(r for _, r in found)
    return MeasuredRestart(detection_s=detection, recovery_s=recovery, total_s=detection + recovery,
                           source=f"measured: median of {len(found)} {path} recoveries under {runs_dir()} "
                                  f"({len(drills)} drill record(s), {len(trainer)} trainer record(s) in "
                                  f"recoveries.jsonl): detection {detection:.2f} s (of {len(detected)}) + recovery "
                                  f"{recovery:.2f} s")
