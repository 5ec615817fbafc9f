"""Quarantine checkpoints: the drill's response to silent data corruption, as a gated tool.

Committed checkpoints taken at or after the step where corruption was detected may hold the
corrupted weights, so they move to `RUN/quarantine/` (kept for the investigation, never
deleted) and a restart loads an older one. Moving a run's checkpoints changes what a resume
loads, so this is a `mutate` tool: it passes the gate and lands in the audit log.
"""
from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from trainops.tools.base import ToolError, tool
from trainops.tools.ids import RunRef
from trainops.trainer.checkpoint_files import list_checkpoints
from trainops.workspace import confine, run_folder


class QuarantineInput(BaseModel):
    run: RunRef = Field(description="Run id under $TRAINOPS_HOME/runs, or the run folder a submit returned.")
    from_step: int = Field(ge=0, description="Quarantine every committed checkpoint taken at or after this step.")


class QuarantineOutput(BaseModel):
    run_dir: str
    quarantined_steps: list[int] = Field(description="Steps moved to RUN/quarantine/, oldest first.")
    quarantine_dir: str


@tool("quarantine_checkpoints", risk="mutate", tags=("checkpoint", "drill"))
def quarantine_checkpoints(inp: QuarantineInput) -> QuarantineOutput:
    """Move a run's committed checkpoints taken at or after `from_step` to RUN/quarantine/ (kept,
    not deleted), so a restart after silent data corruption loads an older, clean one."""
    try:
        run_dir = run_folder(inp.run)
        # each path confined on its own, as corrupt_checkpoint does: a symlinked RUN/checkpoints (or
        # RUN/quarantine) pointing out of the workspace is refused before anything moves
        folder = confine(run_dir / "checkpoints", "checkpoint folder")
        target = confine(run_dir / "quarantine", "quarantine folder")
        entries = [e for e in list_checkpoints(folder) if e.committed and e.step >= inp.from_step]
        sources = [confine(e.path, "checkpoint") for e in entries]
    except ValueError as exc:
        raise ToolError("quarantine_checkpoints", str(exc)) from None
    for entry, source in zip(entries, sources, strict=True):
        if Path(entry.path).is_symlink() or source.parent != folder:
            raise ToolError("quarantine_checkpoints", f"checkpoint {entry.path} is a link or lies outside {folder}: "
                                                      "refusing to move it; inspect the run folder")
    moved = []
    for entry, source in zip(entries, sources, strict=True):
        target.mkdir(exist_ok=True)
        os.replace(source, target / source.name)
        moved.append(entry.step)
    return QuarantineOutput(run_dir=str(run_dir), quarantined_steps=moved, quarantine_dir=str(target))
