"""Writes a trainer run's status.json once its job ends, whichever scheduler ran it (the
trainer's own launcher does this only for `trainops train`).

    python -m trainops.tools.schedulers.run_status RUN_DIR EXIT_CODE
"""
from __future__ import annotations

import sys

from trainops.run_folder import RunFiles
from trainops.trainer.launch import summarize


def write_run_status(run_dir: str, exit_code: int) -> None:
    if not RunFiles(run_dir).config.exists():
        return

    summarize(run_dir, exit_code)


if __name__ == "__main__":
    write_run_status(sys.argv[1], int(sys.argv[2]))
