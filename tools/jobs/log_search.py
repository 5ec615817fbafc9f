"""Bounded log tools: grep a job's or a rank's log, and read a window of lines around one line.

A training log can be gigabytes; an agent's context holds a few thousand words. These tools return
at most `max_matches` lines / `max_bytes` bytes, say when they cut, and give line numbers so the
next call can read just the window around a hit. A job's log comes from its scheduler (so a replayed
scenario answers as it did live); a run's rank log from the run folder, confined to the workspace.
Every line is made inert (secrets scrubbed, control and bidi characters escaped, bounded length):
log text is data written by the job, never an instruction.
"""
from __future__ import annotations

import re

from pydantic import BaseModel, Field, field_validator, model_validator

from trainops.run_folder import TEXT_CUT, RunFiles
from trainops.tools.base import ToolError, tool
from trainops.tools.ids import JobId, RunRef
from trainops.tools.reliability.evidence import inert
from trainops.tools.schedulers import get_scheduler
from trainops.tools.schedulers.base import SchedulerError, SchedulerKind, read_confined
from trainops.workspace import run_folder

MAX_LOG_LINE_CHARS = 500
NOT_READ = ("What of the log was left unread: a log is read as its newest part (run_folder.MAX_TEXT_BYTES), and its "
            "line numbers count from the first line read; empty when all of it was read.")


class LogRef(BaseModel):
    job_id: JobId | None = Field(None, max_length=200, description="The job whose log to read (the id a submit "
                                                                 "returned).")
    run: RunRef | None = Field(None, max_length=500, description="Or a run id under $TRAINOPS_HOME/runs (or its "
                                                              "folder): its rank logs; needs rank.")
    rank: int | None = Field(None, ge=0, le=1_048_575, description="A rank's own log; None = the job's combined log.")
    scheduler: SchedulerKind = "local"

    @model_validator(mode="after")
    def _one_source(self) -> "LogRef":
        if (self.job_id is None) == (self.run is None):
            raise ValueError("give exactly one of job_id (a job's log) or run (a run folder's rank log)")
        if self.run is not None and self.rank is None:
            raise ValueError("a run's logs are per rank: pass rank with run, or pass job_id for the combined log")
        return self


class LogLine(BaseModel):
    line: int = Field(description="1-based line number in the log.")
    text: str


class GrepLogInput(LogRef):
    pattern: str = Field(min_length=1, max_length=200, description="A Python regular expression, e.g. "
                                                                   "'Error|Traceback|NCCL|timed out'.")
    ignore_case: bool = True
    max_matches: int = Field(20, ge=1, le=200, description="Return at most this many matching lines.")
    max_bytes: int = Field(8000, ge=200, le=65536, description="Return at most this many bytes of line text.")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"pattern={value!r} is not a regular expression ({exc}); escape special characters") \
                from None
        return value


class GrepLogOutput(BaseModel):
    source: str = Field(description="Which log was read.")
    total_lines: int
    total_matches: int
    matches: list[LogLine]
    truncated: bool = Field(description="True when matches were left out by max_matches or max_bytes, or the log's "
                                        "start was not read.")
    not_read: str = Field("", description=NOT_READ)


class ReadLogWindowInput(LogRef):
    line: int = Field(ge=1, description="The 1-based line to centre on (a grep_log hit).")
    before: int = Field(10, ge=0, le=200)
    after: int = Field(10, ge=0, le=200)
    max_bytes: int = Field(8000, ge=200, le=65536)


class ReadLogWindowOutput(BaseModel):
    source: str
    total_lines: int
    lines: list[LogLine]
    truncated: bool
    not_read: str = Field("", description=NOT_READ)


def _inert(text: str) -> str:
    return inert(text, MAX_LOG_LINE_CHARS)


def _log_lines(tool_name: str, ref: LogRef) -> tuple[str, list[str], str]:
    """The log's source label, its lines and what of it was not read, read through the scheduler or the
    confined run folder."""
    try:
        if ref.job_id is not None:
            text = get_scheduler(ref.scheduler).logs(ref.job_id, 0, ref.rank)
            source = f"job {ref.job_id}" + (f" rank {ref.rank}" if ref.rank is not None else "")
        else:
            path = RunFiles(run_folder(ref.run)).rank_log(ref.rank)
            if not path.exists():
                raise ToolError(tool_name, f"rank: run {ref.run} has no log for rank {ref.rank} ({path}); check the "
                                           "rank number")
            text = read_confined(path, f"rank {ref.rank} log", "run")
            source = f"run {ref.run} rank {ref.rank}"
    except (SchedulerError, ValueError) as exc:
        raise ToolError(tool_name, str(exc)) from None
    lines = text.splitlines()
    cut = lines.pop(0) if lines and TEXT_CUT.match(lines[0]) else ""
    return source, lines, cut


def _bounded(numbered: list[tuple[int, str]], max_bytes: int) -> tuple[list[LogLine], bool]:
    out, used = [], 0
    for number, raw in numbered:
        text = _inert(raw)
        used += len(text.encode()) + 1
        if used > max_bytes:
            return out, True
        out.append(LogLine(line=number, text=text))
    return out, False


@tool("grep_log", risk="read", tags=("jobs", "logs"))
def grep_log(inp: GrepLogInput) -> GrepLogOutput:
    """Search a job's log or one rank's log for a regular expression; returns the matching lines with
    their line numbers, at most max_matches lines and max_bytes bytes (truncated says so). Read the
    lines around a hit with read_log_window."""
    source, lines, cut_start = _log_lines("grep_log", inp)
    regex = re.compile(inp.pattern, re.I if inp.ignore_case else 0)
    hits = [(n, line) for n, line in enumerate(lines, 1) if regex.search(line)]
    matches, cut = _bounded(hits[:inp.max_matches], inp.max_bytes)
    return GrepLogOutput(source=source, total_lines=len(lines), total_matches=len(hits), matches=matches,
                         truncated=cut or len(hits) > inp.max_matches or bool(cut_start), not_read=cut_start)


@tool("read_log_window", risk="read", tags=("jobs", "logs"))
def read_log_window(inp: ReadLogWindowInput) -> ReadLogWindowOutput:
    """Read the lines of a job's or rank's log around one line (before/after it), at most max_bytes bytes."""
    source, lines, cut_start = _log_lines("read_log_window", inp)
    if inp.line > len(lines):
        raise ToolError("read_log_window", f"line: {source} has {len(lines)} lines, not {inp.line}; pass a line "
                                           "number grep_log returned")
    first, last = max(1, inp.line - inp.before), min(len(lines), inp.line + inp.after)
    window, cut = _bounded([(n, lines[n - 1]) for n in range(first, last + 1)], inp.max_bytes)
    return ReadLogWindowOutput(source=source, total_lines=len(lines), lines=window, truncated=cut or bool(cut_start),
                               not_read=cut_start)
