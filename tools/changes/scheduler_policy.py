"""Scheduler policy changes on real Slurm partitions, validated in a shadow partition first (R-SCH-1).

`change_scheduler_policy` reads the target partition's settings (`scontrol -o show partition`),
applies the change to the shadow partition, replays the regression job set (regression_jobs.toml:
small real trainer jobs) there before and after, and compares the two replays itself (queue wait,
completion, throughput, failures) by the rule in `compare_replays`. The shadow partition is put
back as it was after the replay. Only when the comparison passes does the change land on the
target (the gate has already checked the human approval); the change is recorded
(tools/changes/records.py) with the previous and applied state and the `scontrol update` commands that
restore the previous one, which `trainops rollback CHANGE` runs.

The shadow partition: `[scheduler] shadow_partition` in trusted settings on a real cluster; the
sandbox's own ('shadow', on nodes of its own) when SLURM_CONF is a `trainops sandbox` one.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, StrictInt, StrictStr, field_validator

from trainops.settings import table
from trainops.tools.base import InputCheck, ToolError, tool
from trainops.tools.changes.readback import partition_not_applied, roll_back_failed
from trainops.tools.changes.records import record_change, state_differences
from trainops.tools.governance.claims import SchedulerChange
from trainops.tools.jobs.trainer_job import training_spec
from trainops.tools.sandbox.cluster import SHADOW_PARTITION, state_for_slurm_conf
from trainops.tools.schedulers.base import SchedulerError, TrainingJob
from trainops.tools.schedulers.slurm import SlurmScheduler

TOOL = "change_scheduler_policy"
SCONTROL_TIMEOUT_S = 30
REGRESSION_JOBS = Path(__file__).with_name("regression_jobs.toml")
REGRESSION_RDZV_PORT = 29610  # first of the regression jobs' rendezvous ports (the default 29500 is every job's)
PARTITION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_NAME_LIST = re.compile(r"ALL|[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*")
_DURATION = re.compile(r"(\d+-)?\d{1,2}(:\d{2}){0,2}|\d+")
_UNLIMITED = ("UNLIMITED", "INFINITE")


def _tier(value: str) -> str | None:
    return None if value.isdigit() and int(value) <= 65533 else "an integer 0..65533, e.g. 10"


def _max_time(value: str) -> str | None:
    ok = value.upper() in _UNLIMITED or _DURATION.fullmatch(value)
    return None if ok else "minutes (e.g. 60), [DAYS-]HH:MM:SS (e.g. 1-00:00:00) or UNLIMITED"


def _max_nodes(value: str) -> str | None:
    ok = value.upper() in _UNLIMITED or (value.isdigit() and int(value) >= 1)
    return None if ok else "a positive integer (e.g. 4) or UNLIMITED"


def _oversubscribe(value: str) -> str | None:
    ok = re.fullmatch(r"NO|EXCLUSIVE|(YES|FORCE)(:0*[1-9]\d*)?", value.upper())
    return None if ok else ("NO, EXCLUSIVE, YES[:N] or FORCE[:N] with N >= 1 (e.g. FORCE:2; Slurm stores FORCE:0 as "
                            "EXCLUSIVE: write EXCLUSIVE if that is meant)")


def _preempt_mode(value: str) -> str | None:
    ok = re.fullmatch(r"(OFF|CANCEL|REQUEUE|SUSPEND)(,GANG)?|GANG", value.upper())
    return None if ok else "OFF, CANCEL, REQUEUE or SUSPEND (optionally ',GANG')"


def _names(value: str) -> str | None:
    return None if _NAME_LIST.fullmatch(value) else "ALL or a comma-separated list of names, e.g. acme,team-b"


SETTINGS = {"PriorityTier": _tier, "MaxTime": _max_time, "MaxNodes": _max_nodes, "OverSubscribe": _oversubscribe,
            "PreemptMode": _preempt_mode, "AllowAccounts": _names, "AllowQos": _names}
"""The partition settings this tool changes, each with its check (None, or the form to use)."""
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE"}
NEVER_STARTS = ("PartitionTimeLimit", "PartitionNodeLimit", "PartitionMaxNodes", "PartitionMinNodes",
                "PartitionConfig", "PartitionDown", "PartitionInactive",
                "AccountNotAllowed", "QOSNotAllowed", "InvalidAccount", "InvalidQOS", "ReqNodeNotAvail")
"""Pending reasons that mean the job will never start in this partition as it stands."""
NEVER_STARTS_TEXT = re.compile(r"not permitted to use this partition")
"""Slurm shows a partition's account/QOS/group denial as its description (scontrol writes its spaces as
underscores), not as a reason code."""


def _scontrol(args: list[str]) -> str:
    try:
        done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=SCONTROL_TIMEOUT_S)
    except FileNotFoundError:
        raise ToolError(TOOL, "scontrol is not installed; install Debian's slurm-client") from None
    except subprocess.TimeoutExpired:
        raise ToolError(TOOL, f"scontrol gave no answer in {SCONTROL_TIMEOUT_S} s; is slurmctld running? "
                              "(`trainops sandbox status` for the sandbox)") from None
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise ToolError(TOOL, f"`scontrol {' '.join(args)}` failed: {detail[-1] if detail else done.returncode}")
    return done.stdout


def _fields(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def current_state(target: str) -> dict[str, Any]:
    """The partition's settings this tool manages, its nodes and state, as `scontrol -o show partition` shows them."""
    if not PARTITION_NAME.fullmatch(target):
        raise ValueError(f"partition {target!r} is not a valid name: use letters, digits, '_', '.', '-'")
    lines = [line for line in _scontrol(["-o", "show", "partition", target]).splitlines() if line.strip()]
    shown = _fields(lines[0]) if lines else {}
    if shown.get("PartitionName") != target:
        raise ToolError(TOOL, f"partition {target!r} does not exist on this cluster (`sinfo -s` lists them)")
    return {key: shown.get(key, "") for key in (*SETTINGS, "Nodes", "State")}


def restore_commands(target: str, previous: dict[str, Any]) -> list[list[str]]:
    """The `scontrol update` that gives the partition back every managed setting `previous` recorded."""
    if not PARTITION_NAME.fullmatch(target):
        raise ValueError(f"partition {target!r} is not a valid name")
    problems = [f"{key}={previous.get(key)!r}" for key, check in SETTINGS.items()
                if not isinstance(previous.get(key), str) or check(previous[key])]
    if problems:
        raise ValueError(f"the recorded previous state has bad values ({', '.join(problems)})")
    return [["scontrol", "update", f"PartitionName={target}", *(f"{key}={previous[key]}" for key in SETTINGS)]]


def _update(partition: str, settings: dict[str, str]) -> None:
    _scontrol(["update", f"PartitionName={partition}", *(f"{key}={value}" for key, value in settings.items())])


def configured_shadow_partition(tool: str = TOOL) -> str | None:
    """The configured shadow partition, the sandbox's own, or None; a ToolError for a bad setting."""
    configured = table("scheduler", trusted_only=True)[0].get("shadow_partition")
    if configured is not None:
        if not isinstance(configured, str) or not PARTITION_NAME.fullmatch(configured):
            raise ToolError(tool, f"[scheduler] shadow_partition={configured!r} is not a partition name; fix it in "
                                  "your trusted trainops config")
        return configured
    sandbox = state_for_slurm_conf(os.environ.get("SLURM_CONF", ""))
    return SHADOW_PARTITION if sandbox is not None and sandbox.spec.shadow_nodes else None


def shadow_partition() -> str:
    """The partition changes are replayed in first; a ToolError naming the setting when none is configured."""
    if (shadow := configured_shadow_partition()) is not None:
        return shadow
    raise ToolError(TOOL, "no shadow partition is configured, so the change cannot be validated first (R-SCH-1); set "
                          "[scheduler] shadow_partition = \"NAME\" in your trusted trainops config (a partition on "
                          "nodes of its own), or use `trainops sandbox up`, whose 'shadow' partition is used")


class RegressionJob(BaseModel):
    name: str
    preset: str
    nproc: int = Field(1, ge=1, le=64)
    nodes: int = Field(1, ge=1, le=8, description="A multi-node job, so a MaxNodes cut cannot pass the replay.")
    overrides: list[str] = []


class RegressionSet(BaseModel):
    time_limit_min: int = Field(ge=1)
    replay_timeout_s: float = Field(gt=0)
    job: list[RegressionJob] = Field(min_length=1)


def regression_set() -> RegressionSet:
    return RegressionSet.model_validate(tomllib.loads(REGRESSION_JOBS.read_text()))


class JobResult(BaseModel):
    name: str
    job_id: str | None
    state: str = Field(description="Slurm's final job state, REJECTED (sbatch refused it) or NEVER_STARTED.")
    reason: str = ""
    queue_wait_s: float | None = None
    run_s: float | None = None


class Replay(BaseModel):
    partition: str
    jobs: list[JobResult]
    completed: int
    failures: int
    mean_queue_wait_s: float | None
    span_s: float = Field(description="First submit to last job end.")
    throughput_jobs_per_min: float


def _slurm_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _job_fields(job_id: str) -> dict[str, str]:
    lines = _scontrol(["-o", "show", "job", job_id]).splitlines()
    return _fields(lines[0]) if lines else {}


def replay(partition: str) -> Replay:
    """Submit the regression job set to `partition`, wait for every job to end, and measure."""
    jobs, scheduler = regression_set(), SlurmScheduler()
    started, submitted, results = time.time(), {}, {}
    for index, job in enumerate(jobs.job):
        spec = training_spec(TrainingJob(preset=job.preset, nproc=job.nproc, nodes=job.nodes,
                                               overrides=job.overrides), job.name, [])
        # the set runs at once, often on one node: each job's torchrun rendezvous gets a port of its own
        spec = spec.model_copy(update={"partition": partition, "time_limit_min": jobs.time_limit_min,
                                       "rdzv_port": REGRESSION_RDZV_PORT + index})
        try:
            submitted[job.name] = scheduler.submit(spec).job_id
        except SchedulerError as exc:
            results[job.name] = JobResult(name=job.name, job_id=None, state="REJECTED", reason=str(exc)[-200:])
    deadline = time.monotonic() + jobs.replay_timeout_s
    while len(results) < len(jobs.job):
        for name, job_id in submitted.items():
            if name in results:
                continue
            shown = _job_fields(job_id)
            state, reason = shown.get("JobState", ""), shown.get("Reason", "")
            never = state == "PENDING" and (reason in NEVER_STARTS
                                             or bool(NEVER_STARTS_TEXT.search(reason.replace("_", " "))))
            if state in TERMINAL or never or time.monotonic() > deadline:
                if state not in TERMINAL:
                    subprocess.run(["scancel", job_id], capture_output=True, timeout=SCONTROL_TIMEOUT_S)
                    reason = reason if never else f"not finished within {jobs.replay_timeout_s:g} s ({state})"
                    state = "NEVER_STARTED"
                submit, start, end = (_slurm_time(shown.get(key, "")) for key in ("SubmitTime", "StartTime",
                                                                                  "EndTime"))
                ran = state in TERMINAL and start is not None
                results[name] = JobResult(name=name, job_id=job_id, state=state, reason=reason,
                                          queue_wait_s=start - submit if ran and submit else None,
                                          run_s=end - start if ran and end else None)
        time.sleep(1)
    ordered = [results[job.name] for job in jobs.job]
    completed = sum(result.state == "COMPLETED" for result in ordered)
    waits = [result.queue_wait_s for result in ordered if result.queue_wait_s is not None]
    span = max(time.time() - started, 1.0)
    return Replay(partition=partition, jobs=ordered, completed=completed, failures=len(ordered) - completed,
                  mean_queue_wait_s=sum(waits) / len(waits) if waits else None, span_s=round(span, 1),
                  throughput_jobs_per_min=round(completed * 60 / span, 3))


PASS_RULE = ("passes when the baseline replay completed every job, the replay after the change completed every job "
             "(no failures), its mean queue wait is at most 1.5x the baseline's + 30 s, and its throughput (jobs "
             "completed per minute) is at least half the baseline's")


class Comparison(BaseModel):
    before: Replay
    after: Replay
    passed: bool
    rule: str = PASS_RULE
    reasons: list[str] = Field(description="Each part of the rule that failed.")


def compare_replays(before: Replay, after: Replay) -> Comparison:
    """Judge the replay after the change against the baseline by PASS_RULE."""
    reasons = []
    if before.failures:
        reasons.append(f"the baseline replay itself failed {before.failures} job(s); fix the shadow partition first")
    if after.failures:
        failed = [f"{job.name}: {job.state} {job.reason}".strip() for job in after.jobs if job.state != "COMPLETED"]
        reasons.append(f"{after.failures} job(s) failed after the change ({'; '.join(failed)})")
    if before.mean_queue_wait_s is not None and after.mean_queue_wait_s is not None \
            and after.mean_queue_wait_s > 1.5 * before.mean_queue_wait_s + 30:
        reasons.append(f"mean queue wait {after.mean_queue_wait_s:.1f} s > 1.5 x {before.mean_queue_wait_s:.1f} s "
                       "+ 30 s")
    if after.throughput_jobs_per_min < 0.5 * before.throughput_jobs_per_min:
        reasons.append(f"throughput {after.throughput_jobs_per_min:g} jobs/min < half of "
                       f"{before.throughput_jobs_per_min:g}")
    return Comparison(before=before, after=after, passed=not reasons, reasons=reasons)


class PolicyInput(BaseModel):
    scope: Literal["global", "partition"] = Field(description="What the policy applies to: one partition; 'global' "
                                                              "is forbidden.")
    target: str = Field("", pattern=r"^(|[A-Za-z0-9][A-Za-z0-9_.-]{0,127})$",
                        description="The Slurm partition to change (empty for global).")
    settings: dict[str, StrictStr | StrictInt] = Field(
        description=f"Partition settings to set, e.g. {{'PriorityTier': 10, 'MaxTime': '02:00:00'}}; keys: "
                    f"{', '.join(SETTINGS)}.")
    change: SchedulerChange = Field(description="Who and what the change affects (R-SCH-1).")
    emergency: bool = Field(False, description="Land outside a change window; needs one more approver.")

    @field_validator("target")
    @classmethod
    def _target_is_name(cls, value: str) -> str:
        if value and not PARTITION_NAME.fullmatch(value):
            raise ValueError(f"target={value!r} is not a valid partition name: use letters, digits, '_', '.', '-'")
        return value

    @field_validator("settings")
    @classmethod
    def _known_settings(cls, value: dict[str, str | int]) -> dict[str, str | int]:
        if not value:
            raise ValueError(f"settings is empty: give at least one of {', '.join(SETTINGS)}")
        for key, setting in value.items():
            if key not in SETTINGS:
                raise ValueError(f"settings.{key} is not a partition setting this tool changes: use one of "
                                 f"{', '.join(SETTINGS)} (spelled as scontrol spells them)")
            form = SETTINGS[key](str(setting))
            if form:
                raise ValueError(f"settings.{key}={setting!r} is not valid: use {form}")
        return value


class PolicyOutput(BaseModel):
    target: str
    shadow_partition: str
    comparison: Comparison
    change_id: str = Field(description="The recorded change (`trainops rollback CHANGE` undoes it).")
    previous: dict[str, Any]
    current: dict[str, Any] = Field(description="The target partition as scontrol shows it after the change.")
    rollback_commands: list[list[str]]


def _no_global_policy(inp: PolicyInput) -> str | None:
    if inp.scope == "global":
        return ("scope='global' is on the forbidden list: a global scheduler policy change is outside this agent's "
                "remit; scope it to one partition, or hand it to the scheduler owners")
    return None


def _needs_target(inp: PolicyInput) -> str | None:
    return None if inp.target else "target is empty for scope='partition': name the partition"


def _shadow_replay(shadow: str, settings: dict[str, str]) -> Comparison:
    """Baseline replay, the change on the shadow partition, replay again; the shadow is put back after."""
    shadow_before = current_state(shadow)
    before = replay(shadow)
    _update(shadow, settings)
    try:
        if missed := partition_not_applied(settings, current_state(shadow)):
            raise ToolError(TOOL, f"Slurm did not store the approved settings on the shadow partition {shadow} "
                                  f"({'; '.join(missed)}): nothing was replayed and the target was left untouched; "
                                  "the shadow is put back as it was")
        after = replay(shadow)
    finally:
        for argv in restore_commands(shadow, shadow_before):
            _scontrol(argv[1:])

    left = state_differences(shadow_before, current_state(shadow))
    if left:
        raise ToolError(TOOL, f"the shadow partition {shadow} did not return to its previous state: {'; '.join(left)}")
    return compare_replays(before, after)


def _fail_and_roll_back(target: str, previous: dict[str, Any], rollback: list[list[str]], missed: list[str]) -> None:
    """A change Slurm stored otherwise than approved failed: the partition gets its previous settings
    back, and the error says what differed and whether the read-back after the rollback matches."""
    def undo() -> list[str]:
        for argv in rollback:
            _scontrol(argv[1:])
        return state_differences(previous, current_state(target))

    raise roll_back_failed(TOOL, f"the change to partition {target}", "partition", "Slurm", missed, undo)


@tool(TOOL, risk="mutate", approval_required=True, tags=("tenant-governance", "change-window"),
      checks=(InputCheck("R-SEC-2", _no_global_policy, kind="forbidden"), InputCheck("R-SCH-1", _needs_target)))
def change_scheduler_policy(inp: PolicyInput) -> PolicyOutput:
    """Change a Slurm partition's settings (PriorityTier, MaxTime, MaxNodes, OverSubscribe,
    PreemptMode, AllowAccounts, AllowQos). trainops first replays the regression job set in the
    shadow partition before and after applying the change there and compares the two itself;
    only a passed comparison lets the change land on the target, recorded with the commands
    that restore the previous settings (`trainops rollback CHANGE`). Global changes are
    forbidden (R-SEC-2); needs a human approval token."""
    settings = {key: str(value) for key, value in inp.settings.items()}
    previous = current_state(inp.target)
    rollback = restore_commands(inp.target, previous)
    shadow = shadow_partition()
    comparison = _shadow_replay(shadow, settings)
    if not comparison.passed:
        raise ToolError(TOOL, f"R-SCH-1: the shadow replay in partition {shadow} did not pass, so {inp.target} was "
                              f"left untouched: {'; '.join(comparison.reasons)} (the rule: {PASS_RULE})")
    _update(inp.target, settings)
    applied = current_state(inp.target)
    if missed := partition_not_applied(settings, applied):
        _fail_and_roll_back(inp.target, previous, rollback, missed)
    record = record_change("partition_policy", inp.target, previous, applied, rollback,
                           {"settings": settings, "impact": inp.change.impact, "shadow_partition": shadow,
                            "comparison": comparison.model_dump()})
    return PolicyOutput(target=inp.target, shadow_partition=shadow, comparison=comparison,
                        change_id=record.id, previous=previous, current=applied, rollback_commands=rollback)
