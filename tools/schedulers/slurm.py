"""Slurm: sbatch scripts for a JobSpec and the scheduler policy (forced cancel, requeue that
starts at once, drain/resume), over a transport (trainops.tools.schedulers.slurm_transport):
pyslurm when it is built for the running Slurm, the Slurm CLI otherwise. `SLURM_CONF` selects
the cluster. Job records in `$TRAINOPS_HOME/jobs/slurm-<cluster>-<id>.json` keep the spec and log
path, so logs stay readable after slurmctld forgets the job; the cluster name is part of the key
because job ids restart at 1 on a new cluster."""
from __future__ import annotations

import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

from trainops.run_folder import bounded_text, launch_mark
from trainops.tools.schedulers.base import (
    TERMINAL_STATES,
    JobHandle,
    JobSpec,
    JobStatus,
    NodeInfo,
    PollingWait,
    SchedulerError,
    rank_log,
    spec_ranks,
    tail_text,
)
from trainops.tools.schedulers.job_env import job_environment, shell_filter
from trainops.tools.schedulers.processes import spec_sha256
from trainops.tools.schedulers.slurm_pyslurm import PyslurmTransport
from trainops.tools.schedulers.slurm_transport import (
    KIND,
    CliTransport,
    SlurmJob,
    SlurmTransport,
    accounted_launches,
    controller_address,
    start_now,
    transport_choice,
)
from trainops.trainer.config import ResilienceConfig
from trainops.trainer.launch import record_key_env, supervised_resilience, supervisor_argv, torchrun_argv
from trainops.workspace import jobs_dir

_STATES = {
    "PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending", "REQUEUE_HOLD": "pending",
    "REQUEUE_FED": "pending", "RESV_DEL_HOLD": "pending", "SUSPENDED": "pending",
    "RUNNING": "running", "COMPLETING": "running", "STAGE_OUT": "running", "SIGNALING": "running",
    "RESIZING": "running", "COMPLETED": "completed", "CANCELLED": "cancelled", "PREEMPTED": "cancelled",
    "FAILED": "failed", "TIMEOUT": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed", "DEADLINE": "failed", "SPECIAL_EXIT": "failed",
}
COMPLETING_GRACE_S = 2.0  # a forcibly killed job's steps report back well within this from a live node
KILL_LANDS_S = 2  # a SIGKILL sent through slurmctld reaches a live node's processes well within this
_NODE_STATES = {"idle": "idle", "allocated": "allocated", "mixed": "mixed", "down": "down",
                "drained": "drained", "draining": "draining", "drain": "drained"}


def select_transport() -> SlurmTransport:
    name, _ = transport_choice()
    return PyslurmTransport() if name == "pyslurm" else CliTransport()


def cluster_name() -> str:
    """ClusterName from the active slurm.conf ('cluster' when unset)."""
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"))
    try:
        for line in conf.read_text().splitlines():
            key, _, value = line.strip().partition("=")
            if key == "ClusterName" and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", value.strip()):
                return value.strip()
    except OSError:
        pass
    return "cluster"


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


def sbatch_options(spec: JobSpec, log_path: str) -> list[tuple[str, str]]:
    """(sbatch flag, validated value) for a JobSpec; both transports submit exactly these."""
    options = [("job-name", "name", spec.name), ("nodes", "nodes", spec.nodes + _spare_nodes(spec)),
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
    if _supervised(spec):  # a lost node ends only its own supervisor's step; the job goes on without it
        options.append(("no-kill", "no_kill", "on"))
    if spec.tenant:  # the tenant's Slurm account; its default QOS carries the quota (tools/changes/quotas.py)
        options.append(("account", "tenant", spec.tenant))
    return [(flag, sbatch_value(field, value)[1:-1]) for flag, field, value in options]



# sbatch options that are switches: `--no-kill="on"` is refused ("Invalid --no-kill specification");
# pyslurm takes them as a field set to "on" (slurm_pyslurm.py)
SWITCHES = {"no-kill"}

def batch_script(spec: JobSpec, log_path: str) -> str:
    """The sbatch script for a JobSpec: #SBATCH lines, the job's clean environment (sbatch
    exports nothing of the submitting shell, the script unsets what pyslurm carried, then sets the
    allow-listed values: tools/schedulers/job_env.py), then the command (torchrun under srun, one
    launcher per node, c10d rendezvous on the first node; with in-process restart, one supervisor
    step per node instead)."""
    resilience = _supervised(spec)
    lines = ["#!/bin/bash", *(f"#SBATCH --{flag}" if flag in SWITCHES else f'#SBATCH --{flag}="{value}"'
                              for flag, value in sbatch_options(spec, log_path)),
             "#SBATCH --ntasks-per-node=1", "#SBATCH --open-mode=append", "#SBATCH --requeue", "#SBATCH --export=NONE",
             "set -euo pipefail", f'echo "{launch_mark("job", "$(date +%s.%N)").strip()}"',
             *shell_filter(slurm=True)]
    for key, value in sorted(job_environment(spec, KIND).items()):
        lines.append(f"export {key}={shlex.quote(value)}")
    if spec.launcher == "torchrun" and resilience:
        lines += _supervised_lines(spec, resilience)
    elif spec.launcher == "torchrun":
        lines += [
            'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f"srun --kill-on-bad-exit=1 {_shell_torchrun(spec)} && rc=0 || rc=$?",
        ]
    if spec.launcher == "torchrun":
        if spec.run_dir:
            lines.append(f"{shlex.quote(sys.executable)} -m trainops.tools.schedulers.run_status "
                         f"{shlex.quote(spec.run_dir)} \"$rc\"")
        lines.append('exit "$rc"')
    else:
        lines.append(shlex.join(spec.command))
    return "\n".join(lines) + "\n"


def _supervised(spec: JobSpec) -> ResilienceConfig | None:
    """The run's [resilience] when the job is the embedded trainer and in-process restart applies
    (explicitly on, or auto with spare nodes: the batch script is written away from the nodes)."""
    if spec.launcher != "torchrun":
        return None
    return supervised_resilience(spec.command, spec.nodes * spec.procs_per_node, gpus_here=None)


def _spare_nodes(spec: JobSpec) -> int:
    """Nodes the job allocates beyond its training nodes: the warm spares' (`resilience.spare_nodes`)."""
    return resilience.spare_nodes if (resilience := _supervised(spec)) else 0


def _supervised_lines(spec: JobSpec, resilience: ResilienceConfig) -> list[str]:
    """One supervisor per node, each its own job step, so that a lost node ends only its own step;
    `--no-kill` keeps the allocation when Slurm declares a node down. Node 0's supervisor leads (its
    store on the rendezvous port); the others' steps end once it has (they stop with its store)."""
    def line(index: str) -> str:
        argv = supervisor_argv(sys.executable, spec.procs_per_node, spec.command, resilience, nnodes=spec.nodes,
                               node_index=index, store=f"$head_node:{spec.rdzv_port}")
        text = shlex.join(argv)
        for variable in (index, f"$head_node:{spec.rdzv_port}"):
            if variable.startswith("$"):  # the shell expands these on the node
                text = text.replace(shlex.quote(variable), f'"{variable}"')
        return text

    keyed = record_key_env(supervisor_argv(sys.executable, spec.procs_per_node, spec.command, resilience))
    return [
        *(f"export {name}={shlex.quote(value)}" for name, value in keyed.items()),  # each supervisor takes it out
        'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        'head_node="${nodes[0]}"',
        'for index in $(seq 1 $((${#nodes[@]} - 1))); do',
        f'  srun --nodes=1 --ntasks=1 --nodelist="${{nodes[$index]}}" {line("$index")} &',
        "done",
        f'srun --nodes=1 --ntasks=1 --nodelist="$head_node" {line("0")} && rc=0 || rc=$?',
        'for _ in $(seq 100); do [ -z "$(jobs -rp)" ] && break; sleep 0.1; done',
        'kill $(jobs -rp) 2>/dev/null || true',
    ]


def _shell_torchrun(spec: JobSpec) -> str:
    """The shared torchrun command line as a batch-script line: every argument quoted, except the
    shell variables Slurm fills in on the node (node count, first node, job id)."""
    argv = torchrun_argv(sys.executable, spec.procs_per_node, spec.command, nnodes="$SLURM_NNODES",
                         rdzv_endpoint=f"$head_node:{spec.rdzv_port}", rdzv_id="$SLURM_JOB_ID")
    line = shlex.join(argv)
    for variable in ("$SLURM_NNODES", f"$head_node:{spec.rdzv_port}", "$SLURM_JOB_ID"):
        line = line.replace(shlex.quote(variable), f'"{variable}"')
    return line


def _digest(spec: JobSpec) -> str:
    return spec_sha256(spec)


class SlurmScheduler(PollingWait):
    kind = KIND
    poll_s = 0.5

    def __init__(self, transport: SlurmTransport | None = None) -> None:
        self.transport = transport or select_transport()

    def _jobs(self) -> Path:
        return jobs_dir()

    def _record_path(self, job_id: str) -> Path:
        if not job_id.isdigit():
            raise SchedulerError(KIND, f"job id {job_id!r} is not a Slurm job id (a number, as sbatch printed it)")
        return self._jobs() / f"slurm-{cluster_name()}-{job_id}.json"

    def _record(self, job_id: str) -> dict | None:
        path = self._record_path(job_id)
        return json.loads(path.read_text()) if path.exists() else None

    def submit(self, spec: JobSpec) -> JobHandle:
        stamp = f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        log_path = str(Path(spec.run_dir) / "slurm.log") if spec.run_dir else str(self._jobs() / f"slurm-{stamp}.log")
        script = self._jobs() / f"slurm-{stamp}.sbatch"
        script.write_text(batch_script(spec, log_path))
        try:
            job_id = self.transport.submit(script, sbatch_options(spec, log_path))
        except SchedulerError as exc:
            if spec.tenant:  # pyslurm does not say why; sbatch says "Invalid account"
                raise SchedulerError(KIND, f"{exc}; if tenant {spec.tenant!r} has no Slurm account on this cluster "
                                           "yet, give it a quota with set_tenant_quota, which creates the account"
                                     ) from None
            raise
        handle = JobHandle(job_id=job_id, backend=KIND, name=spec.name, submitted_at=time.time(),
                           run_dir=spec.run_dir, log_path=log_path)
        record = {"handle": handle.model_dump(), "spec": spec.model_dump(), "script": str(script),
                  "cluster": cluster_name(), "transport": self.transport.name, "spec_sha256": _digest(spec)}
        self._record_path(job_id).write_text(json.dumps(record))
        return handle

    def _job(self, job_id: str) -> SlurmJob | None:
        job = self.transport.job(job_id)
        if job is None and self._record(job_id) is None:
            raise SchedulerError(KIND, f"unknown job id {job_id!r}: slurmctld at {controller_address()} does not know "
                                       "it and this workspace never submitted it; list jobs with list_jobs")
        return job

    def status(self, job_id: str) -> JobStatus:
        record = self._record(job_id)
        job = self._job(job_id)
        if job is None:
            return JobStatus(job_id=job_id, backend=KIND, name=record["spec"]["name"], state="unknown",
                             reason="slurmctld has purged the job (MinJobAge) and accounting (sacct) is not enabled",
                             run_dir=record["spec"].get("run_dir"))
        state = _STATES.get(job.state, "unknown")
        exit_code = job.exit_code if state in TERMINAL_STATES else None
        if exit_code == 0 and job.exit_signal:
            exit_code = -job.exit_signal
        return JobStatus(job_id=job_id, backend=KIND, name=job.name, state=state, exit_code=exit_code,
                         nodes=self.transport.hostnames(job.nodelist), reason=f"{job.state}: {job.reason}",
                         submitted_at=job.submitted_at, started_at=job.started_at,
                         ended_at=job.ended_at if state in TERMINAL_STATES else None,
                         run_dir=record["spec"].get("run_dir") if record else None,
                         ranks=spec_ranks(record["spec"]) if record else None)

    def earlier_launches(self, job_id: str, current: JobStatus) -> list[JobStatus]:
        """The job's launches before `current`, which a requeue ended (Slurm's own after a node failure or a
        preemption, an operator's `scontrol requeue`, trainops' requeue_job), from Slurm's accounting: each
        as its own end, the state Slurm recorded for it as the reason; [] without accounting."""
        record = self._record(job_id)
        return [JobStatus(job_id=job_id, backend=KIND, name=job.name,  # a REQUEUED launch is over: cancelled by it
                          state=state if (state := _STATES.get(job.state)) in TERMINAL_STATES else "cancelled",
                          exit_code=-job.exit_signal if job.exit_signal else job.exit_code,
                          nodes=self.transport.hostnames(job.nodelist),
                          reason=f"{job.state}: a launch before the job's requeue (Slurm's accounting)",
                          submitted_at=job.submitted_at, started_at=job.started_at, ended_at=job.ended_at,
                          run_dir=record["spec"].get("run_dir") if record else None, requeued=True)
                for job in accounted_launches(job_id) if job.started_at and job.ended_at
                and (current.started_at is None or job.started_at < current.started_at)]

    def logs(self, job_id: str, tail: int = 100, rank: int | None = None) -> str:
        record = self._record(job_id)
        run_dir = record["spec"].get("run_dir") if record else None
        if rank is not None:
            return tail_text(rank_log(run_dir, rank, KIND, job_id), tail)
        if record is not None:
            path = Path(record["handle"]["log_path"])
        else:
            path = Path(self._job(job_id).stdout)
        return tail_text(bounded_text(path) or "", tail)  # a regular file only, its newest MAX_TEXT_BYTES

    def cancel(self, job_id: str, force: bool = False) -> JobStatus:
        """`scancel`: SIGTERM, KillWait, SIGKILL. `force` first SIGKILLs every step and the batch
        shell, because a plain `scancel --signal=KILL` still takes the KillWait path (measured:
        7.4 s with KillWait=5, against 0.08 s for the steps killed one by one). A job that dies of
        that SIGKILL before slurmctld files the cancel is recorded FAILED, not CANCELLED. A forced
        cancel returns once nothing of the job runs: every step was SIGKILLed, so a job still
        COMPLETING after COMPLETING_GRACE_S is waiting for a node that no longer answers (Slurm
        waits for SlurmdTimeout, ~20 s, to declare it down), not for a process of the job."""
        self.status(job_id)
        if not force:
            self.transport.cancel(job_id)
            return self.wait(job_id, 30, poll_s=0.3)
        self.transport.kill_steps_and_batch(job_id)
        self._until_not_running(job_id)
        try:  # after a forced kill the job may be over already
            self.transport.cancel(job_id)
        except SchedulerError:
            pass
        deadline, completing_since = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            job = self.transport.job(job_id)
            if job is None or _STATES.get(job.state) in TERMINAL_STATES:
                break
            if job.state == "COMPLETING":
                completing_since = completing_since or time.monotonic()
                if time.monotonic() - completing_since > COMPLETING_GRACE_S or self._held_by_a_dead_node(job):
                    break
            time.sleep(0.1)
        return self.status(job_id)

    def _until_not_running(self, job_id: str) -> None:
        """The SIGKILLs are delivered through slurmctld and slurmd, asynchronously: the plain `scancel`
        that files the cancel also sends SIGTERM, so it waits until the batch is seen dead (else, on a
        busy host, a forced cancel ran the job's SIGTERM handler). Kills again after a second; gives up
        after two, as a job on a node that died cannot be seen to die (nor run a handler)."""
        for attempt in range(1, KILL_LANDS_S * 10 + 1):
            job = self.transport.job(job_id)
            if job is None or job.state != "RUNNING":
                return
            if attempt == 10:
                self.transport.kill_steps_and_batch(job_id)
            time.sleep(0.1)

    def _held_by_a_dead_node(self, job: SlurmJob) -> bool:
        """COMPLETING with a node Slurm already knows does not answer (its `*`)."""
        nodes = set(self.transport.hostnames(job.nodelist))
        return any(n.name in nodes and ("NOT_RESPONDING" in n.flags or n.state == "down")
                   for n in self.transport.nodes())

    def requeue(self, job_id: str, spec_sha256: str | None = None) -> JobHandle:
        """Back to pending under the same job id (`scontrol requeue`: Slurm reruns the script it
        stored at submit); a trainer resumes from its checkpoint. A job still COMPLETING (held by a
        dead node) cannot be requeued until Slurm declares the node down, so its recorded spec is
        submitted again as a new job (drained nodes are left out by Slurm), with the same run
        folder: recovery does not wait out SlurmdTimeout. With `spec_sha256` (what an approval
        signed) the recorded spec must have that digest, as the job can rewrite its record."""
        record = self._record(job_id)
        recorded = _digest(JobSpec.model_validate(record["spec"])) if record else None
        if spec_sha256 is not None and recorded != spec_sha256:
            raise SchedulerError(KIND, f"job {job_id}'s record no longer holds the spec submit launched (its sha256 is "
                                       f"not {spec_sha256}, the one the requeue was asked and approved for); nothing "
                                       "was requeued; submit the job again with submit_job")
        self.status(job_id)
        job = self.transport.job(job_id)
        if record is not None and job is not None and job.state == "COMPLETING":
            handle = self.submit(JobSpec.model_validate(record["spec"]))
            replaced = self._record(handle.job_id)
            replaced["replaces"] = job_id
            self._record_path(handle.job_id).write_text(json.dumps(replaced))
            return handle
        self.transport.requeue(job_id)
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
            job = self.transport.job(job_id)
            state = job.state if job else "UNKNOWN"
            if state == "PENDING":
                time.sleep(max(0.0, next_second - time.time()))
                start_now(job_id)
                return
            if state not in ("COMPLETING", "REQUEUED", "RUNNING"):
                return
            time.sleep(0.2)

    def list_jobs(self) -> list[JobStatus]:
        return [JobStatus(job_id=job.job_id, backend=KIND, name=job.name, state=_STATES.get(job.state, "unknown"),
                          reason=f"{job.state}: {job.reason}", nodes=self.transport.hostnames(job.nodelist))
                for job in self.transport.jobs()]

    def list_nodes(self) -> list[NodeInfo]:
        nodes = []
        for node in self.transport.nodes():
            state = node.state
            if "DRAIN" in node.flags:
                state = "drained" if state == "idle" or "DRAINED" in node.flags else "draining"
            nodes.append(NodeInfo(name=node.name, state=_NODE_STATES.get(state, "unknown"), cpus=node.cpus,
                                  reason=node.reason, partitions=list(node.partitions)))
        return nodes

    def _node(self, node: str) -> NodeInfo:
        for info in self.list_nodes():
            if info.name == node:
                return info
        raise SchedulerError(KIND, f"unknown node {node!r}; nodes are: {', '.join(n.name for n in self.list_nodes())}")

    def drain(self, node: str, reason: str) -> NodeInfo:
        self._node(node)
        self.transport.update_node(node, "DRAIN", reason or "drained by trainops")
        return self._node(node)

    def resume(self, node: str) -> NodeInfo:
        """Back to the pool. A node Slurm already returned (ReturnToService) is left as it is:
        Slurm refuses RESUME for a node that is neither drained nor down."""
        info = self._node(node)
        if info.state not in ("drained", "draining", "down"):
            return info
        try:
            self.transport.update_node(node, "RESUME", "")
        except SchedulerError as exc:
            raise SchedulerError(KIND, f"resume {node} (state {info.state}): {exc}") from None
        return self._node(node)
