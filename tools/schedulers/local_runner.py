"""Runs one job command and records its exit code, so a later CLI call can tell a job that
finished from one that died (the local scheduler's parent process is long gone by then).

    python -m trainops.tools.schedulers.local_runner EXIT_FILE [RUN_DIR] -- CMD ARGS...

With RUN_DIR (a trainer run), it also writes the run's status.json when the command ends.

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

from trainops.tools.schedulers.job_env import LAUNCHER_MARKER
from trainops.tools.schedulers.run_status import write_run_status


def main(argv: list[str]) -> int:
    if "--" not in argv[1:3] or argv.index("--") == len(argv) - 1:
        sys.stderr.write("usage: python -m trainops.tools.schedulers.local_runner EXIT_FILE [RUN_DIR] -- CMD ARGS...\n")
        return 2
    split = argv.index("--")
    exit_file, run_dir, command = argv[0], argv[1] if split == 2 else None, argv[split + 1:]
    started = time.time()
    try:
        child = subprocess.Popen(command, env={k: v for k, v in os.environ.items() if k != LAUNCHER_MARKER})
    except OSError as exc:
        sys.stderr.write(f"local_runner: cannot start {command[0]!r}: {exc}\n")
        rc = 127
    else:
        signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
        rc = child.wait()
    if run_dir:
        write_run_status(run_dir, rc)
    tmp = exit_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"exit_code": rc, "started_at": started, "ended_at": time.time()}, fh)
    os.replace(tmp, exit_file)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
