"""Measure, summarise and publish: medians and spreads over repeats, ratios taken from
measurements made side by side in the same run, and the machine they were made on."""
from __future__ import annotations

import os
import platform
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


def _results_path() -> Path:
    """benchmarks/RESULTS.md in a source checkout (the published figures live in the repository);
    from an installed wheel, $TRAINOPS_HOME/bench/RESULTS.md, never a file inside site-packages.
    `TRAINOPS_BENCH_RESULTS` names another file."""
    if os.environ.get("TRAINOPS_BENCH_RESULTS"):
        return Path(os.environ["TRAINOPS_BENCH_RESULTS"]).expanduser()
    here = Path(__file__).resolve()
    if (here.parents[1] / "pyproject.toml").is_file():
        return here.with_name("RESULTS.md")
    from trainops.workspace import home

    folder = home() / "bench"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "RESULTS.md"


RESULTS_PATH = _results_path()
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


def timed(fn: Callable[[], object], repeats: int) -> list[float]:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return samples


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
        met = {True: "yes", False: "no", None: "n/a"}[fig.passed]
        lines.append(
            f"| {fig.name} | {_fmt(fig.median)} {fig.unit} | {_fmt(lo)} ~ {_fmt(hi)} | {len(fig.samples)} | "
            f"{fig.target} | {met} |"
        )
    notes = [f for f in suite.figures if f.note]
    if notes:
        lines += ["", "What limits each figure that misses its target, and other notes:", ""]
        lines += [f"- **{f.name}**: {f.note}" for f in notes]
    lines.append(end)
    return "\n".join(lines)


def write_section(block: str, begin: str, end: str, path: Path = RESULTS_PATH) -> Path:
    """Replace the `begin`..`end` section of RESULTS.md with `block` (appended when absent),
    keeping the sections other scripts own."""
    text = path.read_text() if path.exists() else "# Benchmark results\n\n"
    if begin in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    return path


def publish(suite: Suite, path: Path = RESULTS_PATH) -> Path:
    """Rewrite the suite's section of RESULTS.md."""
    return write_section(render(suite), SUITE_BEGIN, SUITE_END, path)
