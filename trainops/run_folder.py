"""The run folder, `$TRAINOPS_HOME/runs/RUN/`: the name of every file in it (`RunFiles`), the one
way a new one is made, the mark each launch writes into its logs, and the bounded reads every reader
of what a job wrote goes through. The trainer (and the framework adapters) write these files; the
typed records in them, and a reader for each, are trainops/run_records.py.

A run folder is written by processes that can be killed at any moment, and may be poisoned by the
job itself, so its files are read here without trusting them: only a regular file is opened (never a
FIFO a job left there), every read is bounded, and a line still being written is left for the next
read. Turning a run id into a folder is `trainops.workspace.run_folder`, which confines it first.
"""
from __future__ import annotations

import os
import re
import secrets
import stat
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TextIO

from trainops.workspace import check_id, runs_dir


class RunFiles:
    """Every name in a run folder, in one place: the trainer writes them, the tools, skills and
    benchmarks read them, and none of them spells a file name of its own."""

    def __init__(self, run_dir: str | Path):
        self.root = Path(run_dir)

    @property
    def config(self) -> Path:
        return self.root / "config.toml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def checkpoint_journal(self) -> Path:
        return self.root / "checkpoints.jsonl"

    @property
    def faults(self) -> Path:
        return self.root / "faults.jsonl"

    @property
    def heartbeat_dir(self) -> Path:
        return self.root / "heartbeat"

    def heartbeat(self, rank: int) -> Path:
        return self.heartbeat_dir / f"rank{rank}.json"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs_dir / f"rank{rank}.log"

    @property
    def drill_record(self) -> Path:
        return self.root / "drill.json"

    @property
    def exporters(self) -> Path:
        return self.root / "exporters.json"

    @property
    def recoveries(self) -> Path:
        return self.root / "recoveries.jsonl"

    @property
    def workers(self) -> Path:
        return self.root / "workers.jsonl"


def new_run_folder(config: str | None = None, runs_root: Path | None = None, run_id: str | None = None, *,
                   prefix: str = "run", check: Callable[[Path], object] | None = None) -> Path:
    """Make a new run folder, RUN/ with logs/ and (given its text) config.toml: the one function that
    makes one, whoever launches into it (the trainer, a framework adapter, a known-answer check).

    It goes in `runs_root`: the workspace's `runs/` by default, a tenant's runs folder for a tenant's
    job (the tenancy tools name it). Its id is `run_id`, checked to be a folder name, or a new
    `PREFIX-YYYYmmdd-HHMMSS-xxxxxx`, sortable by start time and unique without a lock; an id whose
    folder already holds a config.toml is refused. `check` vets the folder's path before anything is
    made, so a job it refuses leaves no folder behind."""
    run_id = check_id("run", run_id) if run_id else f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    files = RunFiles((runs_root or runs_dir()) / run_id)
    if files.config.exists():
        raise ValueError(f"run id {run_id!r} already exists at {files.root}: choose another --run-id")
    if check is not None:
        check(files.root)
    files.logs_dir.mkdir(parents=True, exist_ok=True)
    if config is not None:
        files.config.write_text(config, encoding="utf-8")
    return files.root


LAUNCH_MARK = re.compile(r"^trainops: (?:rank \d+|job) log of a launch at (\d+(?:\.\d+)?)$", re.M)
"""The first line each launch writes into a rank's log (open_rank_log) and the job's log (launch_mark):
logs are appended across requeues and in-process restarts, and a job end's evidence is its own
launch's lines (this_launch)."""


def launch_mark(what: str, stamp: str) -> str:
    """The mark line of a launch of `what` ("job", "rank 3") at `stamp` (Unix seconds, as text: a batch
    script writes it with `date +%s.%N`)."""
    return f"trainops: {what} log of a launch at {stamp}\n"


def open_rank_log(run_dir: str | Path, rank: int) -> TextIO:
    """Rank `rank`'s log opened for appending, line-buffered, with this launch's mark written first (in
    a logs/ made again if the run's was removed)."""
    RunFiles(run_dir).logs_dir.mkdir(parents=True, exist_ok=True)
    log = open(RunFiles(run_dir).rank_log(rank), "a", buffering=1)  # noqa: SIM115 - the rank's stdout for its life
    log.write(launch_mark(f"rank {rank}", f"{time.time():.3f}"))
    return log


def this_launch(text: str, until: float | None = None) -> str:
    """The lines of a rank's or job's log written by its latest launch that started by `until` (all of
    it when no launch marked it: a log from before the marks, or a tail that cut the mark off)."""
    starts = [m for m in LAUNCH_MARK.finditer(text) if until is None or float(m.group(1)) <= until]
    return text[starts[-1].end():].removeprefix("\n") if starts else text


MAX_LINE_BYTES = 1 << 20  # a metrics or journal line is a few hundred bytes; a longer one is garbage
MAX_RECORD_BYTES = 1 << 20  # a heartbeat or status file, rewritten whole
MAX_SCAN_BYTES = 32 << 20
"""A line reader scans at most the newest this many bytes of what was appended since its offset."""
MAX_KEPT_LINES, MAX_KEPT_BYTES = 20_000, 4 << 20
"""Of what it scanned, it keeps at most the newest this many lines and bytes (a parsed metrics record
costs some 2 KiB: 20,000 of them about 40 MiB, whatever the file's size)."""
MAX_TEXT_BYTES = 16 << 20
"""A log is read as its newest this many bytes."""
_CHUNK = 8 << 20


class Lines(NamedTuple):
    """What one bounded read of a line file found: its kept lines, the offset to read from next, and
    what it left out (bytes before the newest MAX_SCAN_BYTES; older complete lines past the keep caps)."""
    lines: list[bytes]
    offset: int
    skipped_bytes: int = 0
    dropped_lines: int = 0

    def cut(self, name: str) -> str:
        """What the read left out, in a sentence naming the file; "" when it read everything."""
        parts = ([f"its first {self.skipped_bytes:,} bytes not read (a read scans the newest "
                  f"{MAX_SCAN_BYTES >> 20} MiB)"] if self.skipped_bytes else []) + \
                ([f"{self.dropped_lines:,} older lines not read (a read keeps the newest {MAX_KEPT_LINES:,} lines, "
                  f"{MAX_KEPT_BYTES >> 20} MiB)"] if self.dropped_lines else [])
        return f"{name}: {'; '.join(parts)}" if parts else ""


def open_regular(path: str | Path) -> int | None:
    """A read-only descriptor of `path` when it is a regular file; None otherwise (missing, a folder,
    a named pipe or device a job put there). O_NONBLOCK keeps the open of a FIFO from waiting for a
    writer; the fstat then refuses it, so no reader ever hangs on what a job left in its folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_regular(path: str | Path, limit: int = MAX_RECORD_BYTES) -> bytes | None:
    """The bytes of a regular file of at most `limit` bytes; None when it is missing, not a regular
    file, or larger (a bounded read, whatever a job wrote there)."""
    fd = open_regular(path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    return None if len(data) > limit else data


def read_tail(path: str | Path, limit: int = MAX_TEXT_BYTES) -> tuple[bytes, int] | None:
    """The newest `limit` bytes of a regular file, from the first line that starts in them, and the
    number of bytes before them not read; None when it is missing or not a regular file."""
    fd = open_regular(path)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        skipped = max(0, os.fstat(fh.fileno()).st_size - limit)
        fh.seek(skipped)
        data = fh.read(limit)
    if skipped:
        start = data.find(b"\n") + 1 if b"\n" in data else len(data)
        skipped, data = skipped + start, data[start:]
    return data, skipped


TEXT_CUT_NOTE = "trainops: the first {skipped:,} bytes of this log were not read (a read takes its newest {cap} MiB)"
TEXT_CUT = re.compile(r"^trainops: the first [\d,]+ bytes of this log were not read \(")
"""The first line of a log read cut short: a reader (grep_log) reports the cut from it."""


def bounded_text(path: str | Path) -> str | None:
    """A log's text, its newest MAX_TEXT_BYTES (after TEXT_CUT_NOTE's line when older bytes were left
    unread); None when it is missing or not a regular file."""
    read = read_tail(path, MAX_TEXT_BYTES)
    if read is None:
        return None
    data, skipped = read
    text = data.decode(errors="replace")
    return f"{TEXT_CUT_NOTE.format(skipped=skipped, cap=MAX_TEXT_BYTES >> 20)}\n{text}" if skipped else text


def complete_lines(path: Path, offset: int = 0) -> Lines:
    """The newline-terminated lines of a regular file `path` from byte `offset`, and the offset after
    the last one (a line still being written is left for the next read); a missing file, or one that
    is not a regular file, has none. Bounded whatever the file holds: it scans the newest MAX_SCAN_BYTES
    appended since `offset`, up to the size it had when the read began, keeps the newest MAX_KEPT_LINES
    (MAX_KEPT_BYTES) of them, drops a line over MAX_LINE_BYTES, and says what it left out."""
    fd = open_regular(path)
    if fd is None:
        return Lines([], offset)
    kept: deque[bytes] = deque()
    kept_bytes = dropped = 0
    with os.fdopen(fd, "rb") as fh:
        end = os.fstat(fh.fileno()).st_size
        skipped = max(0, end - offset - MAX_SCAN_BYTES)
        offset += skipped
        fh.seek(offset)
        pending, oversized = b"", skipped > 0  # a scan that starts mid-file starts mid-line
        while (want := end - offset - len(pending)) > 0 and (chunk := fh.read(min(_CHUNK, want))):
            parts = (pending + chunk).split(b"\n")
            pending = parts.pop()
            for part in parts:
                if not oversized and len(part) <= MAX_LINE_BYTES:
                    kept.append(part)
                    kept_bytes += len(part)
                    while len(kept) > MAX_KEPT_LINES or kept_bytes > MAX_KEPT_BYTES:
                        kept_bytes -= len(kept.popleft())
                        dropped += 1
                offset += len(part) + 1
                oversized = False
            if len(pending) > MAX_LINE_BYTES:  # skip the rest of an oversized line without holding it
                offset, pending, oversized = offset + len(pending), b"", True
    return Lines(list(kept), offset, skipped, dropped)
