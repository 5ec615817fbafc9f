"""Slurm through its command line (`sbatch --parsable`, `scontrol`, `squeue --json`,
`sinfo --json`, `scancel`). pyslurm binds to one Slurm release (PyPI's is 25.11) and cannot
talk to Debian 12's 22.05, so the CLI is the first-class path; `SLURM_CONF` selects the
cluster. Job records in `$TRAINOPS_HOME/jobs/slurm-<id>.json` keep the spec and log path, so
logs stay readable after slurmctld forgets the job."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from trainops.tools.schedulers.base import (
    TERMINAL_STATES,
    JobHandle,
    JobSpec,
    JobStatus,
    NodeInfo,
    PollingWait,
    SchedulerError,
    rank_log,
    tail_text,
)

KIND = "slurm"
COMMAND_TIMEOUT_S = 60.0

_STATES = {
    "PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending", "RESV_DEL_HOLD": "pending", "SUSPENDED": "pending",
    "RUNNING": "running", "COMPLETING": "running", "STAGE_OUT": "running", "SIGNALING": "running",
    "RESIZING": "running", "COMPLETED": "completed", "CANCELLED": "cancelled", "PREEMPTED": "cancelled",
    "FAILED": "failed", "TIMEOUT": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed", "DEADLINE": "failed", "SPECIAL_EXIT": "failed",
}
_NODE_STATES = {"idle": "idle", "allocated": "allocated", "mixed": "mixed", "down": "down",
                "drained": "drained", "draining": "draining", "drain": "drained"}
_KEYVAL = re.compile(r"(\S+?)=(\S*)")


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
        raise SchedulerError(KIND, f"SLURM_CONF={conf} does not exist (the Slurm CLI would retry for a minute); point SLURM_CONF at the cluster's slurm.conf or unset it")
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except FileNotFoundError:
        raise SchedulerError(KIND, f"`{args[0]}` is not installed; install slurm-wlm (tests/services/install.sh) or use scheduler='local'") from None
    except subprocess.TimeoutExpired:
        raise SchedulerError(KIND, f"`{shlex.join(args)}` gave no answer in {COMMAND_TIMEOUT_S:.0f}s; is slurmctld running at {controller_address()}? check with `scontrol ping`") from None
    if check and out.returncode != 0:
        err = (out.stderr or out.stdout).strip().splitlines()
        detail = err[-1] if err else f"exit code {out.returncode}"
        if "configuration" in detail:
            hint = f"set SLURM_CONF to the cluster's slurm.conf (now {os.environ.get('SLURM_CONF', 'unset, so /etc/slurm/slurm.conf')})"
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
        raise SchedulerError(KIND, f"`{shlex.join(args)}` failed: {detail}{' (' + stderr[-1] + ')' if stderr else ''}; is slurmctld running at {controller_address()}? check with `scontrol ping`")
    return data


def sbatch_value(field: str, value: object) -> str:
    """One `#SBATCH` value, validated and double-quoted. sbatch reads these lines itself and
    strips double quotes (it knows no escapes), while bash would run a line smuggled in after a
    newline: control characters and double quotes are refused, naming the field."""
    text = str(value)
    bad = next((c for c in text if ord(c) < 32 or ord(c) == 127 or c == '"'), None)
    if bad is not None or not text:
        what = f"contains {bad!r}" if bad is not None else "is empty"
        raise SchedulerError(KIND, f"{field}={text!r} {what}: an #SBATCH value must be one line of printable "
                                   "text without double quotes; fix the value")
    return f'"{text}"'


def batch_script(spec: JobSpec, log_path: str) -> str:
    """The sbatch script for a JobSpec: #SBATCH lines, env, then the command (torchrun under
    srun, one launcher per node, c10d rendezvous on the first node)."""
    options = [("job-name", "name", spec.name), ("nodes", "nodes", spec.nodes),
               ("cpus-per-task", "procs_per_node", spec.procs_per_node), ("output", "log_path", log_path)]
    if spec.time_limit_min:
        options.append(("time", "time_limit_min", spec.time_limit_min))
    if spec.partition:
        options.append(("partition", "partition", spec.partition))
    if spec.exclude_nodes:
        for node in spec.exclude_nodes:
            sbatch_value("exclude_nodes", node)
        options.append(("exclude", "exclude_nodes", ",".join(spec.exclude_nodes)))
    if spec.workdir:
        options.append(("chdir", "workdir", spec.workdir))
    lines = ["#!/bin/bash", *(f"#SBATCH --{flag}={sbatch_value(field, value)}" for flag, field, value in options),
             "#SBATCH --ntasks-per-node=1", "#SBATCH --open-mode=append", "#SBATCH --requeue", "set -euo pipefail"]
    for key, value in sorted(spec.env.items()):
        lines.append(f"export {key}={shlex.quote(value)}")
    if spec.launcher == "torchrun":
        lines += [
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f"srun --kill-on-bad-exit=1 {shlex.quote(sys.executable)} -m torch.distributed.run --nnodes \"$SLURM_NNODES\" "
            f"--nproc-per-node {spec.procs_per_node} --rdzv-backend c10d --rdzv-endpoint \"$head_node:{spec.rdzv_port}\" "
            f"--rdzv-id \"$SLURM_JOB_ID\" {shlex.join(spec.command)} && rc=0 || rc=$?",
        ]
        if spec.run_dir:
            lines.append(f"{shlex.quote(sys.executable)} -m trainops.tools.schedulers.run_status {shlex.quote(spec.run_dir)} \"$rc\"")
        lines.append('exit "$rc"')
    else:
        lines.append(shlex.join(spec.command))
    return "\n".join(lines) + "\n"


def parse_scontrol(text: str) -> dict[str, str]:
    return dict(_KEYVAL.findall(text))


def _epoch(value: str | None) -> float | None:
    if not value or value in ("Unknown", "None", "N/A"):
        return None
    try:
        return time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


class SlurmScheduler(PollingWait):
    kind = KIND
    poll_s = 0.5

    def _jobs(self) -> Path:
        from trainops.workspace import jobs_dir

        return jobs_dir()

    def _record(self, job_id: str) -> dict | None:
        if not job_id.isdigit():
            raise SchedulerError(KIND, f"job id {job_id!r} is not a Slurm job id (a number, as sbatch printed it)")
        path = self._jobs() / f"slurm-{job_id}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def submit(self, spec: JobSpec) -> JobHandle:
        stamp = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        log_path = str(Path(spec.run_dir) / "slurm.log") if spec.run_dir else str(self._jobs() / f"slurm-{stamp}.log")
        script = self._jobs() / f"slurm-{stamp}.sbatch"
        script.write_text(batch_script(spec, log_path))
        out = run_cli(["sbatch", "--parsable", str(script)])
        job_id = out.stdout.strip().split(";")[0]
        handle = JobHandle(job_id=job_id, backend=KIND, name=spec.name, submitted_at=time.time(),
                           run_dir=spec.run_dir, log_path=log_path)
        (self._jobs() / f"slurm-{job_id}.json").write_text(json.dumps({"handle": handle.model_dump(), "spec": spec.model_dump(), "script": str(script)}))
        return handle

    def status(self, job_id: str) -> JobStatus:
        record = self._record(job_id)
        out = run_cli(["scontrol", "show", "job", job_id], check=False)
        if out.returncode != 0:
            detail = (out.stderr or out.stdout).strip()
            if "Invalid job id" not in detail:
                run_cli(["scontrol", "show", "job", job_id])
            if record is None:
                raise SchedulerError(KIND, f"unknown job id {job_id!r}: slurmctld at {controller_address()} does not know it and this workspace never submitted it; list jobs with list_jobs")
            return JobStatus(job_id=job_id, backend=KIND, name=record["spec"]["name"], state="unknown",
                             reason="slurmctld has purged the job (MinJobAge) and accounting (sacct) is not enabled",
                             run_dir=record["spec"].get("run_dir"))
        fields = parse_scontrol(out.stdout)
        raw_state = fields.get("JobState", "UNKNOWN")
        code, _, sig = fields.get("ExitCode", "0:0").partition(":")
        state = _STATES.get(raw_state, "unknown")
        exit_code = int(code) if state in TERMINAL_STATES else None
        if exit_code == 0 and sig not in ("", "0"):
            exit_code = -int(sig)
        nodes = [] if fields.get("NodeList", "(null)") == "(null)" else self._hostnames(fields["NodeList"])
        return JobStatus(job_id=job_id, backend=KIND, name=fields.get("JobName", ""), state=state, exit_code=exit_code,
                         nodes=nodes, reason=f"{raw_state}: {fields.get('Reason', 'None')}",
                         started_at=_epoch(fields.get("StartTime")), ended_at=_epoch(fields.get("EndTime")) if state in TERMINAL_STATES else None,
                         run_dir=record["spec"].get("run_dir") if record else None)

    def _hostnames(self, nodelist: str) -> list[str]:
        return run_cli(["scontrol", "show", "hostnames", nodelist]).stdout.split()

    def logs(self, job_id: str, tail: int = 100, rank: int | None = None) -> str:
        record = self._record(job_id)
        run_dir = record["spec"].get("run_dir") if record else None
        if rank is not None:
            return tail_text(rank_log(run_dir, rank, KIND, job_id), tail)
        if record is not None:
            path = Path(record["handle"]["log_path"])
        else:
            path = Path(parse_scontrol(run_cli(["scontrol", "show", "job", job_id]).stdout).get("StdOut", ""))
        return tail_text(path.read_text(errors="replace") if path.is_file() else "", tail)

    def cancel(self, job_id: str, force: bool = False) -> JobStatus:
        """`scancel`: SIGTERM, KillWait, SIGKILL. `force` first SIGKILLs every step and the batch
        shell, because a plain `scancel --signal=KILL` still takes the KillWait path (measured:
        7.4 s with KillWait=5, against 0.08 s for the steps killed one by one). A job that dies of
        that SIGKILL before slurmctld files the cancel is recorded FAILED, not CANCELLED."""
        self.status(job_id)
        if force:
            steps = run_cli(["squeue", "-h", "--steps", "-j", job_id, "-o", "%i"], check=False).stdout.split()
            for step in (s for s in steps if s.partition(".")[2].isdigit()):
                run_cli(["scancel", "--signal=KILL", step], check=False)
            run_cli(["scancel", "--signal=KILL", "--batch", job_id], check=False)
        run_cli(["scancel", job_id], check=not force)  # after a forced kill the job may be over already
        return self.wait(job_id, 30, poll_s=0.1 if force else 0.3)

    def requeue(self, job_id: str) -> JobHandle:
        """`scontrol requeue`: same job id, back to pending; a trainer resumes from its checkpoint."""
        record = self._record(job_id)
        self.status(job_id)
        run_cli(["scontrol", "requeue", job_id])
        self._start_now(job_id)
        if record is not None:
            return JobHandle.model_validate(record["handle"])
        return JobHandle(job_id=job_id, backend=KIND, name="", submitted_at=time.time())

    def _start_now(self, job_id: str, timeout_s: float = 60.0) -> None:
        """slurmctld holds a requeued job behind a BeginTime minutes away; a drill measures
        recovery time, so set it to now once the old allocation has been released, and not
        within the second the old credential was revoked: slurmd refuses a credential made in
        that same second ("Job credential revoked", seen here when a forced cancel and the
        requeue fall in one second). `StartTime=now+1` would avoid that too, but nothing wakes
        the scheduler when it passes (measured: 13-34 s until the backfill cycle)."""
        next_second = int(time.time()) + 1.05  # the old job ended before this call
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            fields = parse_scontrol(run_cli(["scontrol", "show", "job", job_id]).stdout)
            if fields.get("JobState") == "PENDING":
                time.sleep(max(0.0, next_second - time.time()))
                run_cli(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
                return
            if fields.get("JobState") not in ("COMPLETING", "REQUEUED", "RUNNING"):
                return
            time.sleep(0.2)

    def list_jobs(self) -> list[JobStatus]:
        data = run_json(["squeue", "--json"])
        jobs = []
        for job in data.get("jobs", []):
            raw = str(job.get("job_state", "UNKNOWN"))
            jobs.append(JobStatus(job_id=str(job["job_id"]), backend=KIND, name=job.get("name", ""),
                                  state=_STATES.get(raw, "unknown"), reason=f"{raw}: {job.get('state_reason', '')}",
                                  nodes=self._hostnames(job["nodes"]) if job.get("nodes") else []))
        return jobs

    def list_nodes(self) -> list[NodeInfo]:
        data = run_json(["sinfo", "--json"])
        nodes = []
        for node in data.get("nodes", []):
            state = str(node.get("state", "unknown")).lower()
            flags = [str(f).upper() for f in node.get("state_flags", [])]
            if "DRAIN" in flags:
                state = "drained" if state == "idle" or "DRAINED" in flags else "draining"
            nodes.append(NodeInfo(name=node["name"], state=_NODE_STATES.get(state, "unknown"),
                                  cpus=node.get("cpus"), reason=node.get("reason", "") or ""))
        return nodes

    def _node(self, node: str) -> NodeInfo:
        for info in self.list_nodes():
            if info.name == node:
                return info
        raise SchedulerError(KIND, f"unknown node {node!r}; nodes are: {', '.join(n.name for n in self.list_nodes())}")

    def drain(self, node: str, reason: str) -> NodeInfo:
        self._node(node)
        run_cli(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason or 'drained by trainops'}"])
        return self._node(node)

    def resume(self, node: str) -> NodeInfo:
        self._node(node)
        run_cli(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        return self._node(node)
