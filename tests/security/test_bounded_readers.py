"""Readers without bounds (issue 41, class 7): a job that leaves a named pipe where its log was
hangs no reader (`grep_log`, `read_log_window`, `ask`), and a job that writes a huge metrics.jsonl
costs `job_status`, `find_straggler` and `compare_runs` a bounded amount of memory, each answer
saying what was left unread. The attacks are real jobs the local scheduler runs; the readers are the
real command line, measured in their own process (its peak RSS, VmHWM)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.run_folder import new_run_folder
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.jobs.follow import follow
from trainops.tools.reliability import interruptions
from trainops.tools.schedulers import JobSpec, get_scheduler
from trainops.trainer.config import load_config

CLI_REPORTING_ITS_PEAK = ("import atexit, sys; atexit.register(lambda: sys.stderr.write(next(line for line in "
                          "open('/proc/self/status') if line.startswith('VmHWM:')))); "
                          "from trainops.cli import app; app(sys.argv[1:], prog_name='trainops')")
BIG_MB = 48  # over the readers' 32 MiB scan cap: the head of the file goes unread
GROWTH_LIMIT_MIB = 160
REPLACE_STDOUT_WITH_FIFO = ("import os, sys; log = os.readlink('/proc/self/fd/1'); print('Traceback: boom', "
                            "flush=True); os.unlink(log); os.mkfifo(log); sys.exit(3)")
WRITE_METRICS = """
import json, sys
from pathlib import Path
line = ('{"step": %d, "rank": %d, "time": %.3f, "loss": 2.5, "step_time_s": %s, "tokens_per_s": 1000.0, '
        '"mfu_pct": 1.5}\\n')
with open(Path(sys.argv[1]) / "metrics.jsonl", "w") as out:
    written, n = 0, 0
    while written < int(sys.argv[2]) << 20:
        block = "".join(line % ((n + i) // 8, (n + i) % 8, 1.7e9 + n + i, "0.1" if (n + i) % 8 == 3 else "0.4")
                        for i in range(8000))
        out.write(block)
        written, n = written + len(block), n + 8000
sys.exit(1)
"""


def _job(command: list[str], run_dir: Path | None = None, observed: bool = True) -> str:
    """A job run to its failure; waited for through wait_job (which records its end), or, not
    `observed`, through the scheduler alone, leaving its first observation to the reader under test."""
    local = get_scheduler("local")
    handle = local.submit(JobSpec(name="hostile", command=command, run_dir=str(run_dir) if run_dir else None))
    state = (call("wait_job", {"job_id": handle.job_id, "timeout_s": 60}) if observed
             else local.wait(handle.job_id, 60)).state
    assert state == "failed"
    return handle.job_id


@pytest.mark.timeout(60)
def test_a_job_that_replaces_its_log_with_a_fifo_hangs_neither_ask_nor_the_log_tools():
    job = _job([sys.executable, "-c", REPLACE_STDOUT_WITH_FIFO])
    result = CliRunner().invoke(app, ["ask", f"what happened to job {job}?", "--json"])
    assert result.exit_code == 0, result.output
    for tool, extra in (("grep_log", {"pattern": "boom"}), ("read_log_window", {"line": 1})):
        with pytest.raises(ToolError, match="not a regular file"):
            call(tool, {"job_id": job, **extra})


@pytest.mark.timeout(60)
def test_a_fifo_in_place_of_a_rank_log_is_refused_by_grep_log_and_read_log_window():
    run = new_run_folder(None, run_id="r-fifo-log")
    os.mkfifo(run / "logs" / "rank0.log")
    for tool, extra in (("grep_log", {"pattern": "x"}), ("read_log_window", {"line": 1})):
        for ref in ({"run": run.name}, {"job_id": _job([sys.executable, "-c", "raise SystemExit(2)"], run)}):
            with pytest.raises(ToolError, match="not a regular file"):
                call(tool, {**ref, "rank": 0, **extra})


@pytest.mark.timeout(60)
def test_following_a_job_that_replaces_its_log_with_a_fifo_does_not_hang():
    local = get_scheduler("local")
    handle = local.submit(JobSpec(name="hostile", command=[sys.executable, "-c", REPLACE_STDOUT_WITH_FIFO.replace(
        "sys.exit(3)", "import time; time.sleep(2); sys.exit(3)")]))
    assert follow(handle, show_progress=True, timeout_s=30).state == "failed"


@pytest.mark.timeout(60)
def test_a_rank_log_longer_than_the_read_cap_still_gives_its_last_error_as_evidence():
    run = new_run_folder(None, run_id="r-long-log")
    write = ("import sys; log = open(sys.argv[1] + '/logs/rank0.log', 'w'); "
             "[log.write(f'step {n} loss 2.5 ' + 'x' * 100 + '\\n') for n in range(60_000)]; "
             "log.write('Traceback (most recent call last):\\nValueError: batch 60001 has no tokens\\n'); sys.exit(1)")
    job = _job([sys.executable, "-c", write, str(run)], run)
    assert (run / "logs" / "rank0.log").stat().st_size > 6 << 20
    [record] = call("list_interruptions", {"job_id": job}).interruptions
    assert any("batch 60001 has no tokens" in line for line in record.evidence.error_lines), record.evidence


def test_an_interruption_record_past_its_read_cap_still_holds_its_newest_ends(monkeypatch):
    """A long-lived workspace's record outgrows the read cap: its newest ends (the restart budget's)
    are still read, so an end is neither lost nor recorded twice, rather than the record reading empty."""
    monkeypatch.setattr(interruptions, "MAX_RECORD_FILE", 4 << 10)
    jobs = [_job([sys.executable, "-c", "raise SystemExit(2)"]) for _ in range(3)]
    size = interruptions.record_path().stat().st_size
    assert size > 4 << 10
    assert [r.job_id for r in interruptions.read_interruptions(jobs[-1])] == [jobs[-1]]
    call("job_status", {"job_id": jobs[-1]})
    assert interruptions.record_path().stat().st_size == size  # seen again: recorded once


def _peak_rss_mib(tool: str, payload: dict) -> tuple[float, dict]:
    """The command line's own peak RSS (MiB, its VmHWM: a forked child's ru_maxrss starts at its
    parent's) calling `tool`, and its JSON answer."""
    command = ["tool", "call", tool, "--json", "--input", json.dumps(payload)]
    done = subprocess.run([sys.executable, "-P", "-c", CLI_REPORTING_ITS_PEAK, *command], capture_output=True,
                          text=True, env=os.environ, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    peak_kib = int(next(line for line in done.stderr.splitlines() if line.startswith("VmHWM:")).split()[1])
    return peak_kib / 1024, json.loads(done.stdout)


@pytest.mark.timeout(180)
def test_a_huge_metrics_file_costs_job_status_find_straggler_and_compare_runs_bounded_memory():
    config = load_config(preset="tiny").to_toml()
    small, big = new_run_folder(config, run_id="r-small"), new_run_folder(config, run_id="r-huge-metrics")
    _job([sys.executable, "-c", WRITE_METRICS, str(small), "1"], small)
    job = _job([sys.executable, "-c", WRITE_METRICS, str(big), str(BIG_MB)], big, observed=False)
    assert (big / "metrics.jsonl").stat().st_size > BIG_MB << 20
    baseline, _ = _peak_rss_mib("find_straggler", {"run": small.name})
    for tool, payload in (("job_status", {"job_id": job}), ("find_straggler", {"run": big.name}),
                          ("compare_runs", {"baseline": small.name, "candidate": big.name})):
        peak, answer = _peak_rss_mib(tool, payload)
        assert peak - baseline < GROWTH_LIMIT_MIB, f"{tool}: {peak:.0f} MiB against {baseline:.0f} MiB on a tiny run"
        said = json.dumps(answer)
        if tool == "find_straggler":
            assert answer["straggler"] == 3, said  # the newest records still answer
        if tool != "job_status":
            assert "metrics.jsonl" in said and "not read" in said, said  # the answer says what was cut
    record = call("list_interruptions", {"job_id": job}).interruptions[0]
    assert any("metrics.jsonl" in note and "not read" in note for note in record.evidence.not_taken), record.evidence
