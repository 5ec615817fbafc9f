"""Step time of each parallel layout, on the CPU with gloo (functional figures: they show every
layout runs through the real trainer and what it costs here, not what it gains on GPUs).

Each layout is one `trainops.tools.jobs.follow.run_local` run; the figure is the median `step_time_s` of
rank 0 over the steps after the first (the first pays for start-up and shape inference). All
layouts of a preset share seed, data and global batch, so their final losses must agree too;
the table shows them. Results go to benchmarks/RESULTS.md under their own heading.

    .venv/bin/python benchmarks/layouts.py [--presets tiny small] [--steps 6]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time
from pathlib import Path

from trainops.benchmarks.harness import machine, results_path, write_section
from trainops.run_records import read_metrics
from trainops.tools.context import operator_session
from trainops.tools.jobs.follow import run_local
from trainops.trainer.config import load_config

BEGIN, END = "<!-- layouts:begin -->", "<!-- layouts:end -->"
LAYOUTS: dict[str, tuple[int, list[str]]] = {
    "1 process": (1, []),
    "FSDP2 x2": (2, []),
    "DDP x2": (2, ["parallel.data_parallel=ddp"]),
    "TP2": (2, ["parallel.tp=2"]),
    "TP2 + SP": (2, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    "PP2 GPipe": (2, ["parallel.pp=2", "parallel.pp_schedule=GPipe"]),
    "PP2 1F1B": (2, ["parallel.pp=2", "parallel.pp_schedule=1F1B"]),
    "PP2 Interleaved1F1B v2": (2,
                               ["parallel.pp=2", "parallel.pp_schedule=Interleaved1F1B", "parallel.virtual_stages=2"]),
    "PP2 InterleavedZeroBubble v2": (2,
                                     ["parallel.pp=2", "parallel.pp_schedule=InterleavedZeroBubble",
                                      "parallel.virtual_stages=2"]),
    "PP2 ZBVZeroBubble": (2, ["parallel.pp=2", "parallel.pp_schedule=ZBVZeroBubble", "parallel.virtual_stages=2"]),
    "FSDP2 x2 x TP2": (4, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
    "PP2 x FSDP2 x2": (4, ["parallel.pp=2"]),
}
BASE = ["data.kind=synthetic", "training.seq_len=64", "training.global_batch=8", "training.micro_batch=2",
        "metrics.log_every=1000"]


def measure(preset: str, nproc: int, overrides: list[str], steps: int) -> dict:
    cfg = load_config(None, preset, BASE + [f"training.steps={steps}"] + overrides)
    result = run_local(cfg, nproc, timeout_s=900)
    times = [r.step_time_s for r in read_metrics(result.run_dir) if r.rank == 0 and r.step > 1]
    return {"status": result.status, "final_loss": result.final_loss,
            "step_time_s": statistics.median(times) if times else None,
            "spread": (min(times), max(times)) if times else None, "n": len(times)}


def row(preset: str, name: str, nproc: int, r: dict) -> str:
    step = f"{r['step_time_s']:.4g}" if r["step_time_s"] is not None else "not measured"
    spread = f"{r['spread'][0]:.4g} ~ {r['spread'][1]:.4g}" if r["spread"] else "not measured"
    loss = f"{r['final_loss']:.5f}" if r["final_loss"] is not None else "not measured"
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    return f"| {preset} | {name} | {nproc} | {step} | {spread} | {r['n']} | {loss} | {r['status']} | {when} |"


def _key(line: str) -> tuple[str, str]:
    cells = [c.strip() for c in line.strip("|").split("|")]
    return cells[0], cells[1]


def render(new_rows: list[str], old_rows: list[str], steps: int) -> str:
    """The section: rows measured now replace the same (preset, layout) rows; others are kept."""
    fresh = {_key(line) for line in new_rows}
    names = list(LAYOUTS)
    rows = [line for line in old_rows if _key(line) not in fresh] + new_rows
    rows.sort(key=lambda line: (_key(line)[0] != "tiny", _key(line)[0],
                                names.index(_key(line)[1]) if _key(line)[1] in names else len(names)))
    info = machine()
    return "\n".join([
        BEGIN, "## Parallel layouts on CPU (`benchmarks/layouts.py`)", "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in info.items()) + f". gloo, seq_len 64, global batch 8, "
        f"micro-batch 2, fp32, {steps} steps per run; figure = median step time of rank 0 over steps 2..{steps}. "
        "Functional figures: the host is shared and has fewer cores than ranks, so more processes mostly means "
        "more time-slicing; the final losses agreeing across layouts is the point; GPU scaling figures come "
        "with the benchmark issue.", "",
        "| preset | layout | ranks | step time (s) | spread (min ~ max) | n | final loss | status | measured (UTC) |",
        "|---|---|---|---|---|---|---|---|---|", *rows, END])


def existing_rows(path: Path | None = None) -> list[str]:
    path = path or results_path()
    text = path.read_text() if path.exists() else ""
    match = re.search(re.escape(BEGIN) + r"(.*?)" + re.escape(END), text, flags=re.S)
    if not match:
        return []
    return [line for line in match.group(1).splitlines() if line.startswith("| ") and not line.startswith("| preset")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), help="layout names (default: all)")
    args = parser.parse_args()
    os.environ.setdefault("TRAINOPS_HOME", tempfile.mkdtemp(prefix="bench-layouts-"))
    rows = []
    for preset in args.presets:
        for name in args.layouts:
            nproc, overrides = LAYOUTS[name]
            result = measure(preset, nproc, overrides, args.steps)
            rows.append(row(preset, name, nproc, result))
            print(f"{preset:6s} {name:30s} {result}", flush=True)
    write_section(render(rows, existing_rows(), args.steps), BEGIN, END)
    print(f"wrote {results_path()}")


if __name__ == "__main__":
    with operator_session():  # a human runs the benchmark, as with `trainops bench`
        main()
