"""Measure, summarise and publish: medians and spreads over repeats, ratios taken from
measurements made side by side in the same run, and the machine they were made on."""
from __future__ import annotations

import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from trainops.run_records import read_metrics
from trainops.tools.jobs.follow import run_local
from trainops.trainer.config import load_config
from trainops.trainer.launch import torchrun_argv
from trainops.workspace import home

if TYPE_CHECKING:
    from trainops.run_records import MetricsRecord


def results_path() -> Path:
    """benchmarks/RESULTS.md in a source checkout (the published figures live in the repository);
    from an installed wheel, $TRAINOPS_HOME/bench/RESULTS.md, never a file inside site-packages.
    `TRAINOPS_BENCH_RESULTS` names another file."""
    if os.environ.get("TRAINOPS_BENCH_RESULTS"):
        return Path(os.environ["TRAINOPS_BENCH_RESULTS"]).expanduser()
    here = Path(__file__).resolve()
    if (here.parents[1] / "pyproject.toml").is_file():
        return here.with_name("RESULTS.md")

    folder = home() / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "RESULTS.md"


SUITE_BEGIN = "<!-- suite:begin -->"
SUITE_END = "<!-- suite:end -->"
GPU_BEGIN = "<!-- gpu:begin -->"  # benchmarks/gpu_mfu.py owns this section
GPU_END = "<!-- gpu:end -->"


@dataclass
class Figure:
    """One benchmark figure: its samples, the target it is judged by, and why it misses."""
    name: str
    samples: list[float]
    unit: str
    target: str = ""
    passed: bool | None = None
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> tuple[float, float]:
        return min(self.samples), max(self.samples)


@dataclass
class Suite:
    figures: list[Figure] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    def add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure


def interleaved(a: Callable[[], float], b: Callable[[], float], repeats: int) -> tuple[list[float], list[float]]:
    """Run a and b alternately so that drift on a noisy machine hits both alike."""
    xs, ys = [], []
    for _ in range(repeats):
        xs.append(a())
        ys.append(b())
    return xs, ys


def ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Pairwise ratios of side-by-side samples (pair i was measured back to back)."""
    return [n / d for n, d in zip(numerators, denominators, strict=True) if d > 0]


WARMUP_STEPS = 5  # left out of every step-time median: allocator, first collectives, caches
CRASHED_RUNS: list[str] = []  # runs that died and were run again, for the notes


def single_thread_env() -> dict[str, str]:
    """The environment every measured process gets: one intra-op thread per process."""
    return dict(os.environ, OMP_NUM_THREADS="1")


def steady(step_times: list[float]) -> float:
    return statistics.median(step_times[WARMUP_STEPS:])


def iteration_times(records: list[MetricsRecord]) -> list[float]:
    """Wall time between rank 0's consecutive step records: the whole iteration, the per-step
    duties the trainer's own `step_time_s` leaves out (checksum, record, heartbeat) included, as a
    peer's or a plain loop's timer includes everything in its loop. The first step has none."""
    times = sorted(r.time for r in records if r.rank == 0)
    return [later - earlier for earlier, later in zip(times, times[1:], strict=False)]


def run_trainer(overrides: list[str], nproc: int) -> Path:
    """Train the tiny preset + `overrides` on `nproc` local ranks; the run folder (a failed run raises)."""
    result = run_local(load_config(None, "tiny", overrides), nproc)
    if result.status != "ok":
        raise RuntimeError(f"benchmark trainer run failed: read {result.run_dir}/logs")
    return Path(result.run_dir)


def trainer_step_time(overrides: list[str], nproc: int) -> float:
    """Median steady-state iteration time of the embedded trainer (tiny preset + `overrides`, rank 0)."""
    return steady(iteration_times(read_metrics(run_trainer(overrides, nproc))))


def torchrun_step_time(program: list[str], nproc: int, what: str, rerun_on_crash: bool = False) -> float:
    """Run `program --out FILE` under torchrun on `nproc` processes, one thread each; the steady-state
    step time it writes. With `rerun_on_crash`, a run that dies is run once more and named in
    CRASHED_RUNS (DeepSpeed ZeRO-1 aborted in 1 of ~20 runs here)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "steps.json"
        attempts = 2 if rerun_on_crash else 1
        for attempt in range(1, attempts + 1):
            done = subprocess.run(torchrun_argv(sys.executable, nproc, [*program, "--out", str(out)]),
                                  capture_output=True, text=True, env=single_thread_env())
            if done.returncode == 0:
                return steady(json.loads(out.read_text())["step_time_s"])
            if attempt < attempts:
                CRASHED_RUNS.append(f"{what} (exit {done.returncode})")
    raise RuntimeError(f"{what} run failed: {done.stderr[-1500:]}")


def machine() -> dict[str, str]:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
    }


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _unit(unit: str) -> str:
    """The unit as the text rules write it: '%' glued to the number, any other unit after a space."""
    return unit if unit in ("%", "") else f" {unit}"


def render(suite: Suite, title: str = "## Suite (`make bench`)", begin: str = SUITE_BEGIN,
           end: str = SUITE_END) -> str:
    lines = [begin, title, ""]
    info = machine()
    lines.append(
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(suite.started))} on "
        + ", ".join(f"{k} {v}" for k, v in info.items())
        + f"; suite wall time {time.time() - suite.started:.0f} s."
    )
    lines += ["", "| figure | median | spread (min ~ max) | n | target | met |", "|---|---|---|---|---|---|"]
    for fig in suite.figures:
        lo, hi = fig.spread
        met = {True: "yes", False: "no", None: "no target"}[fig.passed]
        lines.append(
            f"| {fig.name} | {_fmt(fig.median)}{_unit(fig.unit)} | {_fmt(lo)} ~ {_fmt(hi)} | {len(fig.samples)} | "
            f"{fig.target} | {met} |"
        )
    notes = [f for f in suite.figures if f.note]
    if notes:
        lines += ["", "What limits each figure that misses its target, and other notes:", ""]
        lines += [f"- **{f.name}**: {f.note}" for f in notes]
    lines.append(end)
    return "\n".join(lines)


def write_section(block: str, begin: str, end: str, path: Path | None = None) -> Path:
    """Replace the `begin`..`end` section of RESULTS.md with `block` (appended when absent),
    keeping the sections other scripts own."""
    path = path or results_path()
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if begin in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    return path


def publish(suite: Suite, path: Path | None = None) -> Path:
    """Rewrite the suite's section of RESULTS.md."""
    return write_section(render(suite), SUITE_BEGIN, SUITE_END, path)
