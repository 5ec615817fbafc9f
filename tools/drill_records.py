"""Measured figures for the planners, read back from the drills' own records: the restart time of the
newest multi-node drill in the workspace (detection + isolation + requeue + checkpoint load), with
where it came from, so a plan names its evidence instead of an assumed number."""
from __future__ import annotations

import json
from datetime import datetime, timezone

from pydantic import BaseModel, Field

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
    for path in runs_dir().glob("*/drill.json") if runs_dir().is_dir() else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if "node_timeline" in record and {"detection_latency_s", "recovery_time_s", "injected_time"} <= set(record):
            records.append((float(record["injected_time"]), path, record))
    if not records:
        raise ToolError(tool_name, f"restart_from='newest_node_drill': no multi-node drill record under {runs_dir()}; "
                                   "run `trainops drill --scheduler slurm --nodes 2 --fault node-crash` (or partition) "
                                   "first, or give restart_s")
    when, path, record = max(records, key=lambda r: r[0])
    detection, recovery = float(record["detection_latency_s"]), float(record["recovery_time_s"])
    stamp = datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return MeasuredRestart(detection_s=detection, recovery_s=recovery, total_s=detection + recovery,
                           source=f"measured: {record.get('fault')} drill of {stamp} ({path}): detection "
                                  f"{detection:.2f} s + isolation, requeue and load {recovery:.2f} s")
