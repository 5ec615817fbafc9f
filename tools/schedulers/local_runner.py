"""Runs one job command and records its exit code, so a later CLI call can tell a job that
finished from one that died (the local scheduler's parent process is long gone by then).

    python -m trainops.tools.schedulers.local_runner [--time-limit-s S --kill-wait-s G]
        EXIT_FILE [RUN_DIR] -- CMD ARGS...

With RUN_DIR (a trainer run), it also writes the run's status.json when the command ends.
With a time limit (the spec's time_limit_min), a command still running S seconds after its start
is stopped as Slurm stops a job past its limit: SIGTERM to each of its processes, up to G seconds
for a clean exit, then SIGKILL; the exit file says it timed out.

The local scheduler starts it as a session leader with LAUNCHER_MARKER=<job id> in its
environment: that, as the kernel shows it, is how tools know this process is the job's launcher
(processes.py). The command does not inherit the marker.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from trainops.tools.schedulers.job_env import LAUNCHER_MARKER
from trainops.tools.schedulers.run_status import write_run_status

USAGE = ("usage: python -m trainops.tools.schedulers.local_runner [--time-limit-s S --kill-wait-s G] EXIT_FILE "
         "[RUN_DIR] -- CMD ARGS...\n")


def _limits(argv: list[str]) -> tuple[float | None, float, list[str]]:
    """The time limit and kill wait in front of the positional arguments, and the rest."""
    limit_s, kill_wait_s = None, 0.0
    while argv[:1] and argv[0] in ("--time-limit-s", "--kill-wait-s") and len(argv) > 1:
        if argv[0] == "--time-limit-s":
            limit_s = float(argv[1])
        else:
            kill_wait_s = float(argv[1])
        argv = argv[2:]
    return limit_s, kill_wait_s, argv


def _stop_at_time_limit(child: subprocess.Popen, kill_wait_s: float) -> int:
    """SIGTERM every process of the command's tree (its ranks may sit in sessions of their own), up to
    `kill_wait_s` for the command to exit, then SIGKILL what is left of the tree; the command's exit code."""
    try:
        tree = [psutil.Process(child.pid), *psutil.Process(child.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return child.wait()
    for proc in tree:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    try:
        return child.wait(timeout=kill_wait_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        for proc in tree[1:]:  # ranks the command left behind; the command itself is reaped by wait
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
    child.kill()
    return child.wait()


def main(argv: list[str]) -> int:
    try:
        limit_s, kill_wait_s, argv = _limits(argv)
    except ValueError:
        sys.stderr.write(USAGE)
        return 2
    if "--" not in argv[1:3] or argv.index("--") == len(argv) - 1:
        sys.stderr.write(USAGE)
        return 2
    split = argv.index("--")
    exit_file, run_dir, command = argv[0], argv[1] if split == 2 else None, argv[split + 1:]
    started, timed_out = time.time(), False
    try:
        child = subprocess.Popen(command, env={k: v for k, v in os.environ.items() if k != LAUNCHER_MARKER})
    except OSError as exc:
        sys.stderr.write(f"local_runner: cannot start {command[0]!r}: {exc}\n")
        rc = 127
    else:
        signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
        try:
            rc = child.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            sys.stderr.write(f"local_runner: the job ran past its time limit ({limit_s:.0f} s): SIGTERM, then "
                             f"SIGKILL after {kill_wait_s:.0f} s\n")
            sys.stderr.flush()
            rc = _stop_at_time_limit(child, kill_wait_s)
    if run_dir:
        write_run_status(run_dir, rc)
    tmp = exit_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"exit_code": rc, "started_at": started, "ended_at": time.time(), "timed_out": timed_out}, fh)
    os.replace(tmp, exit_file)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
