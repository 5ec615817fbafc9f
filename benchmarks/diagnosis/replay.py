"""Replay a posted failure through trainops' own launch path: `submit_job` with a plain `JobSpec`
on the local scheduler runs a job whose output is the posted log and that ends as the real job
ended (an exit code, a signal, or a hang that is then cancelled); `wait_job` observes the end,
which writes the interruption record as for any job. Nothing here reads the classifier: the
record is what an on-call engineer would read.

How a case's `exit` becomes the replayed end (the real job's end, as close as one host allows):
an exit code is that code; "unknown" and Slurm's FAILED are exit 1 (the job failed, the thread
gives no code); Slurm's TIMEOUT, PREEMPTED and REQUEUED end the job with SIGTERM (what slurmstepd
sends first); OUT_OF_MEMORY and "137 (SIGKILL)" with SIGKILL (the cgroup OOM killer); SIGABRT
with SIGABRT; "hang" prints the log, then sleeps until trainops cancels it (force)."""
from __future__ import annotations

import re
import shutil
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from trainops.tools.calls import invoke
from trainops.tools.jobs import jobs
from trainops.tools.reliability.interruptions import Interruption, read_interruptions
from trainops.tools.schedulers.base import JobSpec
from trainops.workspace import home

CASES = Path(__file__).with_name("cases")
HANG_WAIT_S = 30.0

ENDS: dict[str, str] = {
    "unknown": "1", "FAILED": "1", "hang": "hang",
    "TIMEOUT": "SIGTERM", "PREEMPTED": "SIGTERM", "REQUEUED": "SIGTERM",
    "OUT_OF_MEMORY": "SIGKILL", "137 (SIGKILL)": "SIGKILL", "SIGABRT": "SIGABRT",
}
"""A case's `exit` -> how the replayed job ends (a number is an exit code, SIG* a signal)."""

JOB_SCRIPT = """\
import os, signal, sys, time
sys.stdout.write(open(sys.argv[1], encoding="utf-8", errors="replace").read())
sys.stdout.write("\\n")
sys.stdout.flush()
end = sys.argv[2]
if end == "hang":
    time.sleep(3600)
elif end.startswith("SIG"):
    os.kill(os.getpid(), getattr(signal, end))
    time.sleep(5)
sys.exit(int(end) if end.lstrip("-").isdigit() else 1)
"""


@dataclass(frozen=True)
class Case:
    """One frozen case: cases/<slug>/case.toml and its log.txt (cases/README.md says what each field means)."""
    slug: str
    cause_class: str
    sub_cause: str
    naming_line: str
    framework: str
    scheduler: str
    exit: str
    requeue_helps: bool
    failing_rank: int | None
    log_path: Path

    @property
    def end(self) -> str:
        return ENDS.get(self.exit, self.exit.split()[0] if self.exit[:1].isdigit() else "1")


def load_cases(folder: Path = CASES) -> list[Case]:
    """Every case of the frozen set, by slug."""
    cases = []
    for toml in sorted(folder.glob("*/case.toml")):
        data = tomllib.loads(toml.read_text())
        cases.append(Case(slug=toml.parent.name, cause_class=data["cause_class"], sub_cause=data["sub_cause"],
                          naming_line=data["naming_line"], framework=data.get("framework", "other"),
                          scheduler=data.get("scheduler", "unknown"), exit=str(data.get("exit", "unknown")),
                          requeue_helps=bool(data.get("requeue_helps", False)),
                          failing_rank=data.get("failing_rank"), log_path=toml.parent / "log.txt"))
    return cases


def _job_name(slug: str) -> str:
    return ("dx-" + re.sub(r"[^a-z0-9-]", "-", slug.lower()))[:50].rstrip("-")


def replay(case: Case, timeout_s: float = 60.0) -> Interruption | None:
    """Run the case as a job in the current workspace and return the record of its end (None: no
    record, i.e. trainops saw a clean finish). The caller sets up the workspace and the operator session."""
    folder = home() / "diagnosis" / case.slug
    folder.mkdir(parents=True, exist_ok=True)
    log_copy, script = folder / "log.txt", folder / "posted_job.py"
    shutil.copyfile(case.log_path, log_copy)
    script.write_text(JOB_SCRIPT)
    spec = JobSpec(name=_job_name(case.slug), command=["python3", str(script), str(log_copy), case.end])
    job_id = invoke(jobs.submit_job, jobs.SubmitJobInput(spec=spec)).handle.job_id
    if case.end == "hang":
        _cancel_after_log(job_id, log_copy)
    status = invoke(jobs.wait_job, jobs.WaitJobInput(job_id=job_id, timeout_s=timeout_s))
    if not status.finished:
        invoke(jobs.cancel_job, jobs.CancelJobInput(job_id=job_id, force=True))
    records = read_interruptions(job_id)
    return records[-1] if records else None


def _cancel_after_log(job_id: str, log_copy: Path) -> None:
    """A hung job: once its whole log is out, trainops cancels it (as an operator would)."""
    last = next((ln.strip() for ln in reversed(log_copy.read_text(errors="replace").splitlines()) if ln.strip()), "")
    deadline = time.monotonic() + HANG_WAIT_S
    while time.monotonic() < deadline:
        text = invoke(jobs.job_logs, jobs.JobLogsInput(job_id=job_id, tail=0)).text
        if last[:80] in text:
            break
        time.sleep(0.1)
    invoke(jobs.cancel_job, jobs.CancelJobInput(job_id=job_id, force=True))
