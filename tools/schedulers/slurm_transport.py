"""How trainops talks to slurmctld: the Slurm command line, or pyslurm when it binds this Slurm.

Both transports answer the same small questions (submit a script, read a job, list jobs and
nodes, signal, requeue, drain) with the same plain records, so `SlurmScheduler` holds the
policy once and the tests run it through either. `select_transport()` picks pyslurm when it is
importable and built for the running Slurm's release (pyslurm 22.5.x for Slurm 22.05), the CLI
otherwise; `TRAINOPS_SLURM_TRANSPORT=cli|pyslurm` forces one.
"""
from __future__ import annotations

import functools
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trainops.tools.schedulers.base import SchedulerError

KIND = "slurm"
COMMAND_TIMEOUT_S = 60.0
_KEYVAL = re.compile(r"(\S+?)=(\S*)")


@dataclass(frozen=True)
class SlurmJob:
    """One job as slurmctld reports it, whatever the transport."""

    job_id: str
    name: str
    state: str  # Slurm's own upper-case state, e.g. RUNNING, NODE_FAIL
    exit_code: int
    exit_signal: int
    nodelist: str  # compressed, e.g. n[1-2]; "" before allocation
    reason: str
    started_at: float | None
    ended_at: float | None
    stdout: str = ""
    submitted_at: float | None = None


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # lower case base state: idle, allocated, mixed, down, ...
    flags: tuple[str, ...] = field(default_factory=tuple)  # upper case: DRAIN, NOT_RESPONDING, ...
    cpus: int | None = None
    reason: str = ""
    partitions: tuple[str, ...] = ()


def partition_names(value: object) -> tuple[str, ...]:
    """A node's partitions as either transport gives them: a list, or one comma-separated string."""
    items = value.split(",") if isinstance(value, str) else value if isinstance(value, (list, tuple)) else []
    return tuple(str(item).strip() for item in items if str(item).strip())


class SlurmTransport(Protocol):
    name: str

    def submit(self, script: Path, options: list[tuple[str, str]]) -> str: ...
    def job(self, job_id: str) -> SlurmJob | None: ...
    def jobs(self) -> list[SlurmJob]: ...
    def hostnames(self, nodelist: str) -> list[str]: ...
    def steps(self, job_id: str) -> list[str]: ...
    def kill_steps_and_batch(self, job_id: str) -> None: ...
    def cancel(self, job_id: str) -> None: ...
    def requeue(self, job_id: str) -> None: ...
    def nodes(self) -> list[SlurmNode]: ...
    def update_node(self, node: str, state: str, reason: str) -> None: ...


def controller_address() -> str:
    """SlurmctldHost from the active slurm.conf, for error messages."""
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    try:
        for line in conf.read_text().splitlines():
            if line.strip().startswith(("SlurmctldHost", "ControlMachine")):
                return f"{line.split('=', 1)[1].strip()} (from {conf})"
    except OSError:
        return f"unknown ({conf} not readable)"
    return f"unknown (no SlurmctldHost in {conf})"


def run_cli(args: list[str], check: bool = True) -> subprocess.CompletedProcess:
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():
        raise SchedulerError(KIND, f"SLURM_CONF={conf} does not exist (the Slurm CLI would retry for a minute); "
                                   "point SLURM_CONF at the cluster's slurm.conf or unset it")
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError:
        raise SchedulerError(KIND, f"`{args[0]}` is not installed; install slurm-wlm (tests/services/install.sh) "
                                   "or use scheduler='local'") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(KIND, f"`{shlex.join(args)}` gave no answer in {COMMAND_TIMEOUT_S:.0f}s; is slurmctld "
                                   f"running at {controller_address()}? check with `scontrol ping`") from None
    if check and out.returncode != 0:
        err = (out.stderr or out.stdout).strip().splitlines()
        detail = err[-1] if err else f"exit code {out.returncode}"
        if "configuration" in detail:
            hint = ("set SLURM_CONF to the cluster's slurm.conf (now "
                    f"{os.environ.get('SLURM_CONF', 'unset, so /etc/slurm/slurm.conf')})")
        elif "contact" in detail or "onnect" in detail:
            hint = f"is slurmctld running at {controller_address()}? check with `scontrol ping`"
        else:
            hint = "check the arguments"
        raise SchedulerError(KIND, f"`{shlex.join(args)}` failed: {detail}; {hint}")
    return out


def run_json(args: list[str]) -> dict:
    """A `--json` command; 22.05 exits 0 with an `errors` list when it cannot reach slurmctld."""
    out = run_cli(args)
    data = json.loads(out.stdout)
    errors = data.get("errors") or []
    if errors:
        detail = "; ".join(str(e.get("description") or e.get("error")) for e in errors)
        stderr = out.stderr.strip().splitlines()
        raise SchedulerError(KIND, f"`{shlex.join(args)}` failed: {detail}{' (' + stderr[-1] + ')' if stderr else ''}; "
                                   f"is slurmctld running at {controller_address()}? check with `scontrol ping`")
    return data


def parse_scontrol(text: str) -> dict[str, str]:
    return dict(_KEYVAL.findall(text))


def _epoch(value: str | None) -> float | None:
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


_LAUNCH_FIELDS = "JobID,JobName,State,ExitCode,Submit,Start,End,NodeList"


def accounted_launches(job_id: str) -> list[SlurmJob]:
    """Every launch of the job as Slurm's accounting recorded it (`sacct --duplicates`: a job Slurm
    requeued, after a node failure or a preemption, keeps its id and gets one row per launch), oldest
    first; [] where accounting is not enabled. Whatever the transport, sacct is the one reader of it."""
    out = run_cli(["sacct", "-j", job_id, "--duplicates", "-X", "-P", "-n", f"--format={_LAUNCH_FIELDS}"],
                  check=False)
    found = []
    for line in out.stdout.splitlines() if out.returncode == 0 else []:
        parts = line.split("|")
        if len(parts) != len(_LAUNCH_FIELDS.split(",")) or parts[0] != job_id:
            continue
        _, name, state, exit_code, submitted, started, ended, nodelist = parts
        code, _, sig = exit_code.partition(":")
        found.append(SlurmJob(job_id=job_id, name=name, state=state.split()[0] if state else "UNKNOWN",
                              exit_code=int(code or 0) if code.isdigit() else 0,
                              exit_signal=int(sig) if sig.isdigit() else 0,
                              nodelist="" if nodelist in ("", "None assigned") else nodelist, reason="None",
                              started_at=_epoch(started), ended_at=_epoch(ended), submitted_at=_epoch(submitted)))
    return sorted(found, key=lambda j: j.started_at or 0.0)


class CliTransport:
    """`sbatch --parsable`, `scontrol`, `squeue --json`, `sinfo --json`, `scancel`."""

    name = "cli"

    def submit(self, script: Path, options: list[tuple[str, str]]) -> str:
        """The options are already #SBATCH lines of the script, which sbatch reads itself."""
        return run_cli(["sbatch", "--parsable", str(script)]).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> SlurmJob | None:
        out = run_cli(["scontrol", "show", "job", job_id], check=False)
        if out.returncode != 0:
            if "Invalid job id" not in (out.stderr or out.stdout):
                run_cli(["scontrol", "show", "job", job_id])  # raises with the real reason
            return None
        fields = parse_scontrol(out.stdout)
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        nodelist = fields.get("NodeList", "(null)")
        return SlurmJob(job_id=job_id, name=fields.get("JobName", ""), state=fields.get("JobState", "UNKNOWN"),
                        exit_code=int(code or 0), exit_signal=int(sig or 0),
                        nodelist="" if nodelist == "(null)" else nodelist, reason=fields.get("Reason", "None"),
                        started_at=_epoch(fields.get("StartTime")), ended_at=_epoch(fields.get("EndTime")),
                        stdout=fields.get("StdOut", ""), submitted_at=_epoch(fields.get("SubmitTime")))

    def jobs(self) -> list[SlurmJob]:
        found = []
        for job in run_json(["squeue", "--json"]).get("jobs", []):
            found.append(SlurmJob(job_id=str(job["job_id"]), name=job.get("name", ""),
                                  state=str(job.get("job_state", "UNKNOWN")), exit_code=0, exit_signal=0,
                                  nodelist=job.get("nodes") or "", reason=job.get("state_reason", ""),
                                  started_at=None, ended_at=None))
        return found

    def hostnames(self, nodelist: str) -> list[str]:
        return run_cli(["scontrol", "show", "hostnames", nodelist]).stdout.split() if nodelist else []

    def steps(self, job_id: str) -> list[str]:
        out = run_cli(["squeue", "-h", "--steps", "-j", job_id, "-o", "%i"], check=False).stdout.split()
        return [s for s in out if s.partition(".")[2].isdigit()]

    def kill_steps_and_batch(self, job_id: str) -> None:
        for step in self.steps(job_id):
            run_cli(["scancel", "--signal=KILL", step], check=False)
        run_cli(["scancel", "--signal=KILL", "--batch", job_id], check=False)

    def cancel(self, job_id: str) -> None:
        run_cli(["scancel", job_id])

    def requeue(self, job_id: str) -> None:
        run_cli(["scontrol", "requeue", job_id])

    def nodes(self) -> list[SlurmNode]:
        found = []
        for node in run_json(["sinfo", "--json"]).get("nodes", []):
            found.append(SlurmNode(name=node["name"], state=str(node.get("state", "unknown")).lower(),
                                   flags=tuple(str(f).upper() for f in node.get("state_flags", [])),
                                   cpus=node.get("cpus"), reason=node.get("reason", "") or "",
                                   partitions=partition_names(node.get("partitions"))))
        return found

    def update_node(self, node: str, state: str, reason: str) -> None:
        run_cli(["scontrol", "update", f"NodeName={node}", f"State={state}", *([f"Reason={reason}"] if reason else [])])


def start_now(job_id: str) -> None:
    """`StartTime=now` for a requeued job: pyslurm 22.5 binds no job update, so both transports use scontrol."""
    run_cli(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])


@functools.cache
def slurm_release() -> str | None:
    """The running Slurm's release as `major.minor` (e.g. 22.05), from `sinfo --version`; asked once
    per process (every SlurmScheduler chooses its transport)."""
    try:
        out = subprocess.run(["sinfo", "--version"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"(\d+)\.(\d+)", out.stdout)
    return f"{int(match.group(1))}.{int(match.group(2)):02d}" if match else None


_PROBED: dict[str, str | None] = {}


def pyslurm_version() -> str | None:
    """pyslurm's version, probed in a child process: `import pyslurm` exits the process when no
    slurm.conf is reachable, so the import is tried where that cannot take trainops down."""
    conf = os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")
    if conf not in _PROBED:
        if not Path(conf).is_file():
            return None
        try:
            out = subprocess.run([sys.executable, "-c", "import pyslurm; print(pyslurm.version())"],
                                 capture_output=True, text=True, timeout=30)
            _PROBED[conf] = out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None
        except (OSError, subprocess.TimeoutExpired):
            _PROBED[conf] = None
    return _PROBED[conf]


def pyslurm_matches(version: str | None, release: str | None) -> bool:
    """pyslurm X.Y.z binds Slurm X.0Y (22.5.3 <-> 22.05)."""
    if not version or not release:
        return False
    major, minor = version.split(".")[:2]
    return release == f"{int(major)}.{int(minor):02d}"


def transport_choice() -> tuple[str, str]:
    """(transport name, why) for `trainops env` and the scheduler."""
    forced = os.environ.get("TRAINOPS_SLURM_TRANSPORT", "auto")
    if forced not in ("auto", "cli", "pyslurm"):
        raise SchedulerError(KIND, f"TRAINOPS_SLURM_TRANSPORT={forced!r} is not valid: use auto, cli or pyslurm")
    if forced == "cli":
        return "cli", "forced by TRAINOPS_SLURM_TRANSPORT=cli"
    version, release = pyslurm_version(), slurm_release()
    if pyslurm_matches(version, release):
        return "pyslurm", f"pyslurm {version} matches Slurm {release}"
    why = (f"pyslurm {version} does not match Slurm {release}" if version
           else "pyslurm is not importable here (build it from source for this Slurm: tests/services/build_pyslurm.sh)")
    if forced == "pyslurm":
        raise SchedulerError(KIND, f"TRAINOPS_SLURM_TRANSPORT=pyslurm, but {why}")
    return "cli", why
