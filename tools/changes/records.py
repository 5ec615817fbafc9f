"""Recorded changes and their rollback.

A change tool (change_scheduler_policy, set_tenant_quota) reads the scheduler's state before it
acts, reads it back after, and saves a ChangeRecord under `$TRAINOPS_HOME/changes/ID.json` with the
commands that restore the previous state. Each kind's module (KIND_MODULES) says how to read the
state now (`current_state`) and how to restore it (`restore_commands`), so `rollback_change` can
regenerate the commands from the recorded previous state and refuse a record whose stored commands
were edited: the human signs the exact commands, and only those generated from `previous` run.
"""
from __future__ import annotations

import importlib
import json
import re
import secrets
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from trainops.tools.base import InputCheck, ToolError, tool
from trainops.tools.context import active_call
from trainops.tools.governance.written import newest_written, unbound, write_bound
from trainops.tools.ids import SafeId
from trainops.workspace import home

ChangeKind = Literal["partition_policy", "tenant_quota"]
KIND_MODULES = {"partition_policy": "trainops.tools.changes.scheduler_policy",
                "tenant_quota": "trainops.tools.changes.quotas"}
CHANGE_ID = re.compile(r"chg-\d{8}T\d{6}-[0-9a-f]{6}")
RESTORE_PROGRAMS = ("scontrol", "sacctmgr")
"""The only programs a restore command may run."""
COMMAND_TIMEOUT_S = 60
TOOL = "rollback_change"


class ChangeRecord(BaseModel):
    id: str = Field(description="chg-YYYYmmddTHHMMSS-<6 hex>")
    kind: ChangeKind
    target: str = Field(description="Partition name, or tenant id.")
    previous: dict[str, Any] = Field(description="The state read from the scheduler before the change.")
    applied: dict[str, Any] = Field(description="The state read back after the change landed.")
    rollback_commands: list[list[str]] = Field(description="argv lists (scontrol / sacctmgr only) generated from "
                                                           "`previous`.")
    evidence: dict[str, Any] = Field(default_factory=dict, description="E.g. the shadow-queue comparison.")
    approved_call: str | None = None
    time: float
    rolled_back_at: float | None = None


RECORDED_KIND = "change_written"


def new_change_id() -> str:
    return f"chg-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def _changes_dir() -> Path:
    return home() / "changes"


def _change_path(change_id: str) -> Path:
    if not isinstance(change_id, str) or not CHANGE_ID.fullmatch(change_id):
        raise ValueError(f"change id {change_id!r} is not valid: it looks like chg-20260101T120000-a1b2c3 "
                         "(`trainops changes` lists them)")
    return _changes_dir() / f"{change_id}.json"


def record_change(kind: ChangeKind, target: str, previous: dict[str, Any], applied: dict[str, Any],
                  rollback_commands: list[list[str]], evidence: dict[str, Any]) -> ChangeRecord:
    """Save a change that just landed, with the human-approved call it ran under (the audit trail's link)."""
    running = active_call()
    record = ChangeRecord(id=new_change_id(), kind=kind, target=target, previous=previous, applied=applied,
                          rollback_commands=rollback_commands, evidence=evidence,
                          approved_call=running.approved_call if running else None, time=time.time())
    save_change(record)
    return record


def save_change(record: ChangeRecord) -> Path:
    """Write the record atomically, bound to the audit log (tools/governance/written.py): a record written
    or edited by anything else matches no entry, and is read as no change at all."""
    return write_bound(_change_path(record.id), RECORDED_KIND, record.id, record.model_dump_json(indent=2).encode())


def read_change(change_id: str, newest: dict[str, dict] | None = None) -> ChangeRecord:
    """The stored record; a ValueError naming the file and the fix when it is missing or bad (`newest`:
    the audit's entries of change records, read once by a caller that reads many)."""
    path = _change_path(change_id)
    if not path.is_file():
        raise ValueError(f"no change {change_id!r}: {path} does not exist; `trainops changes` lists the recorded ones")
    data = path.read_bytes()
    try:
        record = ChangeRecord.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        raise ValueError(f"{path} is not a valid change record ({where}: {first['msg']}); restore it from the audit "
                         "log, or undo the change by hand from the scheduler's state") from None
    if record.id != change_id:
        raise ValueError(f"{path} holds change {record.id!r}, not {change_id!r}; the file was renamed or edited")
    if why := unbound(RECORDED_KIND, change_id, data, newest):
        raise ValueError(f"{path} is not a change trainops recorded: {why}; refusing to act on it. Undo the change by "
                         "hand from the scheduler's state; `trainops audit` shows the changes trainops recorded")
    return record


def list_changes() -> list[ChangeRecord]:
    """Every readable record, oldest first (an unreadable one is skipped; read_change names its problem)."""
    records = []
    folder = _changes_dir()
    paths = sorted(folder.glob("chg-*.json")) if folder.is_dir() else []
    newest = newest_written(RECORDED_KIND) if paths else {}
    for path in paths:
        try:
            records.append(read_change(path.stem, newest))
        except ValueError:
            continue
    return sorted(records, key=lambda record: record.time)


def kind_module(kind: str):
    """The module that reads and restores state of this kind."""
    if kind not in KIND_MODULES:
        raise ValueError(f"change kind {kind!r} is not known: use one of {', '.join(KIND_MODULES)}")
    return importlib.import_module(KIND_MODULES[kind])


def run_restore_command(argv: list[str]) -> str:
    """Run one restore command (scontrol or sacctmgr only); a ToolError naming the command when it fails."""
    if not argv or argv[0] not in RESTORE_PROGRAMS:
        raise ToolError(TOOL, f"restore command {argv!r} is not a {' or '.join(RESTORE_PROGRAMS)} command; "
                              "refusing to run it")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError:
        raise ToolError(TOOL, f"{argv[0]} is not installed; install Debian's slurm-client") from None
    except subprocess.TimeoutExpired:
        raise ToolError(TOOL, f"`{' '.join(argv)}` gave no answer in {COMMAND_TIMEOUT_S} s; is the controller "
                              "running?") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise ToolError(TOOL, f"`{' '.join(argv)}` failed: {detail[-1] if detail else done.returncode}")
    return done.stdout


def state_differences(expected: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """Each field whose value differs, as `field: expected X, found Y`."""
    return [f"{key}: expected {expected.get(key)!r}, found {actual.get(key)!r}"
            for key in sorted(set(expected) | set(actual)) if expected.get(key) != actual.get(key)]


def _replay_line(label: str, replay: dict[str, Any]) -> str:
    wait = replay.get("mean_queue_wait_s")
    return (f"{label}: {replay.get('completed')} completed, {replay.get('failures')} failed, mean queue wait "
            + (f"{wait:.1f} s" if isinstance(wait, (int, float)) else "unknown"))


def review_lines(record: ChangeRecord) -> list[str]:
    """What a reviewer judges a change by (A-OUT-4), in words: who it affects, what it changed field by
    field, the shadow replay's verdict and why, and the exact commands a rollback runs."""
    evidence = record.evidence
    state = "rolled back" if record.rolled_back_at else "in effect"
    lines = [f"{record.id} {record.kind} {record.target}: {state}"]
    if evidence.get("impact"):
        lines.append(f"  impact: {evidence['impact']}")
    if evidence.get("reason"):
        lines.append(f"  reason: {evidence['reason']}")
    moved = [f"{key} {record.previous.get(key)} -> {record.applied.get(key)}"
             for key in sorted(set(record.previous) | set(record.applied))
             if record.previous.get(key) != record.applied.get(key)]
    lines.append(f"  changed: {'; '.join(moved) or 'nothing Slurm shows'}")
    comparison = evidence.get("comparison")
    if isinstance(comparison, dict):
        verdict = "passed" if comparison.get("passed") else "failed"
        lines.append(f"  shadow replay on {evidence.get('shadow_partition')}: {verdict}"
                     + "".join(f"; {reason}" for reason in comparison.get("reasons", [])))
        lines += [f"    {_replay_line(label, comparison.get(label) or {})}" for label in ("before", "after")]
    else:
        lines.append("  shadow replay: none (a quota is checked by reading Slurm's accounting back)")
    lines.append(f"  rollback (`trainops rollback {record.id}`, approved by a human) runs:")
    lines += [f"    {shlex.join(argv)}" for argv in record.rollback_commands]
    return lines


class RollbackInput(BaseModel):
    change_id: SafeId = Field(description="The recorded change to undo, e.g. chg-20260101T120000-a1b2c3.")
    commands: list[list[str]] = Field(description="The exact restore commands to run (argv lists), as the change "
                                                  "record stores them; the approver signs these.")


class RollbackOutput(BaseModel):
    change_id: str
    target: str
    ran: list[list[str]]
    restored: bool = Field(description="True when the state read back equals the recorded previous state field by "
                                       "field.")
    differences: list[str] = Field(description="Fields still differing from the recorded previous state.")


def _check_commands(inp: RollbackInput) -> str | None:
    """The signed commands must be the record's and those regenerated from its previous state."""
    try:
        record = read_change(inp.change_id)
    except ValueError as exc:
        return str(exc)
    if record.rolled_back_at is not None:
        return f"change {record.id} was already rolled back at {time.ctime(record.rolled_back_at)}"
    try:
        generated = kind_module(record.kind).restore_commands(record.target, record.previous)
    except (ValueError, KeyError, TypeError, ToolError) as exc:
        return f"cannot regenerate the restore commands of {record.id} from its previous state: {exc}"
    if record.rollback_commands != generated:
        return (f"change {record.id}: the stored rollback_commands differ from those generated from its recorded "
                "previous state; the record was edited; refusing (undo the change by hand from the scheduler's state)")
    if inp.commands != generated:
        return (f"commands differ from change {record.id}'s restore commands; sign exactly these: "
                f"{json.dumps(generated)}")
    return None


@tool(TOOL, risk="mutate", approval_required=True, tags=("tenant-governance",),
      checks=(InputCheck("R-SCH-1", _check_commands),))
def rollback_change(inp: RollbackInput) -> RollbackOutput:
    """Undo a recorded scheduler change (a partition policy or a tenant quota): run the exact restore
    commands the record stores, after checking they are the ones generated from the recorded
    previous state, then read the state back and compare it with the previous state field by
    field. Needs a human approval token for these exact commands."""
    problem = _check_commands(inp)
    if problem:
        raise ToolError(TOOL, problem)
    record = read_change(inp.change_id)
    module = kind_module(record.kind)
    for argv in inp.commands:
        run_restore_command(argv)
    differences = state_differences(record.previous, module.current_state(record.target))
    if not differences:
        save_change(record.model_copy(update={"rolled_back_at": time.time()}))
    return RollbackOutput(change_id=record.id, target=record.target, ran=inp.commands, restored=not differences,
                          differences=differences)
