"""MFU of the embedded trainer on one GPU: a Llama-3-style ~1B model (the `llama3-1b` preset)
in bf16, eager vs `torch.compile`, without and with selective activation checkpointing, and
the async checkpoint stalls (plain and pinned two-phase) against a sync save. Writes
gpu-results.md and gpu-results.json.

Run through benchmarks/gpu.sh on a GPU machine; nothing else in trainops needs a GPU.
`--allow-cpu --preset tiny` runs the same code on the CPU, so the tests keep the script working
between GPU loans (its figures then mean nothing).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from trainops.benchmarks.harness import GPU_BEGIN, GPU_END, write_section
from trainops.run_records import SaveEntry, read_journal, read_metrics
from trainops.tools.context import operator_session
from trainops.tools.jobs.follow import run_local
from trainops.trainer.config import load_config

ARMS = {
    "bf16 eager": ["training.compile=false"],
    "bf16 compile": ["training.compile=true"],
    "bf16 compile + selective AC": ["training.compile=true", "training.activation_checkpointing=selective"],
}
CHECKPOINT_MODES = ("sync", "async", "async_pinned")


def _shape(args) -> list[str]:
    return ["training.precision=bf16", "data.kind=synthetic", f"training.seq_len={args.seq_len}",
            f"training.global_batch={args.batch}", f"training.micro_batch={args.batch}",
            f"training.steps={args.steps}", "training.deterministic=false", "training.warmup_steps=2"]


def measure_arm(name: str, overrides: list[str], args) -> dict:
    cfg = load_config(None, args.preset, [*_shape(args), *overrides])
    started = time.time()
    result = run_local(cfg, 1, timeout_s=args.run_timeout_s)
    if result.status != "ok":
        return {"arm": name, "status": "failed", "run_dir": result.run_dir, "failure": result.failure}
    steady = [r for r in read_metrics(result.run_dir) if r.rank == 0 and r.step > args.warmup]
    return {
        "arm": name, "status": "ok", "run_dir": result.run_dir, "wall_s": time.time() - started,
        "mfu_pct": statistics.median(r.mfu_pct for r in steady),
        "tokens_per_s": statistics.median(r.tokens_per_s for r in steady),
        "step_time_s": statistics.median(r.step_time_s for r in steady),
        "peak_mem_gib": max(r.peak_mem_gib for r in steady),
        "peak_source": steady[-1].peak_source,
    }


def summarize_saves(saves: list[SaveEntry], failure: str | None = None) -> dict | None:
    """Stall figures from a run's `save` journal records, each stall without the wait for the
    previous background write: that wait only measures an interval too short for the write
    (reported apart, with the write time, so a reader can size the interval). A run that failed
    after some saves still yields their figures, with its failure."""
    if not saves:
        return None
    stalls_s = [save.stall_s - save.wait_previous_s for save in saves]
    return {"stall_s": statistics.median(stalls_s), "stalls_s": stalls_s,
            "wait_previous_s": max(save.wait_previous_s for save in saves),
            "write_s": statistics.median(save.write_s for save in saves),
            "size_gib": saves[-1].size_bytes / 2**30, "saves": len(saves), "failure": failure}


def checkpoint_stall(mode: str, args) -> dict | None:
    """One run saving in `mode`; its checkpoints are deleted afterwards: at ~15 GB each for
    llama3-1b, three modes would fill a small disk."""
    cfg = load_config(None, args.preset, [*_shape(args), f"training.steps={args.checkpoint_steps}",
                                          "checkpoint.enable=true", f"checkpoint.interval={args.checkpoint_interval}",
                                          f"checkpoint.mode={mode}"])
    result = run_local(cfg, 1, timeout_s=args.run_timeout_s)
    shutil.rmtree(Path(result.run_dir) / cfg.checkpoint.folder, ignore_errors=True)
    failure = None if result.status == "ok" else (result.failure or f"exit code {result.exit_code}")
    return summarize_saves(read_journal(result.run_dir).saves, failure)


def _failure_note(stall: dict) -> str:
    return f" Then the run failed: {stall['failure']}." if stall["failure"] else ""


def this_machine() -> dict[str, str]:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (script check, not a figure)"
    return {"gpu": gpu, "torch": torch.__version__, "cuda": str(torch.version.cuda),
            "measured_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def render(args, rows: list[dict], stalls: dict[str, dict | None], machine: dict[str, str]) -> list[str]:
    """The results as Markdown; from its third line on, the GPU section of RESULTS.md."""
    lines = ["# GPU MFU", "",
             f"{machine['gpu']}, torch {machine['torch']} (CUDA {machine['cuda']}); {args.preset} preset, bf16, "
             f"seq {args.seq_len}, batch {args.batch}, {args.steps} steps, median over steps > {args.warmup}; "
             f"measured {machine['measured_utc']}", "",
             "| arm | MFU | tokens/s/GPU | step time | peak memory |", "|---|---|---|---|---|"]
    for row in rows:
        if row["status"] != "ok":
            lines.append(f"| {row['arm']} | failed: {row['failure']} (logs: {row['run_dir']}/logs) | | | |")
            continue
        lines.append(f"| {row['arm']} | {row['mfu_pct']:.1f}% | {row['tokens_per_s']:.0f} | "
                     f"{row['step_time_s'] * 1000:.0f} ms | {row['peak_mem_gib']:.1f} GiB |")
    lines.append("")
    peak = next((row["peak_source"] for row in rows if row["status"] == "ok"), None)
    if peak:
        lines += [f"MFU against {peak} (bf16 dense peak).", ""]
    sync = stalls.get("sync")
    if sync:
        lines.append(f"Checkpoint ({sync['size_gib']:.1f} GiB, {args.checkpoint_steps} steps, interval "
                     f"{args.checkpoint_interval}, median of {sync['saves']} saves; a stall leaves out the wait "
                     f"for the previous background write): sync stall {sync['stall_s']:.3f} s." + _failure_note(sync))
    for mode in ("async", "async_pinned"):
        stall = stalls.get(mode)
        if sync and stall:
            lines.append(f"Checkpoint stall {mode}: {stall['stall_s']:.3f} s vs sync {sync['stall_s']:.3f} s "
                         f"(ratio {stall['stall_s'] / sync['stall_s']:.3f}, target <= 0.10; saves: {stall['saves']}); "
                         f"background write {stall['write_s']:.1f} s, longest wait for the previous write "
                         f"{stall['wait_previous_s']:.1f} s." + _failure_note(stall))
        elif mode in stalls:
            lines.append(f"Checkpoint stall {mode}: not measured (a run failed before its first save; read its "
                         "logs under $TRAINOPS_HOME/runs).")
        else:
            lines.append(f"Checkpoint stall {mode}: not measured yet.")
    return lines


def publish(args, rows: list[dict], stalls: dict[str, dict | None]) -> list[str]:
    """Write the results so far: a short loan that ends mid-run still leaves every finished figure."""
    out = Path(args.out)
    machine = this_machine()
    report = {**machine, "model": f"{args.preset} preset", "seq_len": args.seq_len, "batch": args.batch,
              "steps": args.steps, "warmup": args.warmup, "arms": rows, "checkpoint": stalls,
              "checkpoint_stall_s": {mode: (stall or {}).get("stall_s") for mode, stall in stalls.items()}}
    (out / "gpu-results.json").write_text(json.dumps(report, indent=2))
    lines = render(args, rows, stalls, machine)
    (out / "gpu-results.md").write_text("\n".join(lines) + "\n")
    if torch.cuda.is_available():  # a real figure: it replaces the GPU section of RESULTS.md
        body = "\n".join(["## GPU (`benchmarks/gpu.sh`)", "", *lines[2:]])
        write_section(f"{GPU_BEGIN}\n{body}\n{GPU_END}", GPU_BEGIN, GPU_END)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="benchmarks/gpu-results")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10, help="steps excluded (compile happens here)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--preset", default="llama3-1b")
    parser.add_argument("--arm", action="append", choices=list(ARMS), help="measure only these arms (repeatable)")
    parser.add_argument("--checkpoint-steps", type=int, default=6, help="steps of each checkpoint-stall run")
    parser.add_argument("--checkpoint-interval", type=int, default=2, help="save every N steps in those runs")
    parser.add_argument("--run-timeout-s", type=float, default=900.0, help="stop a training run after this long")
    parser.add_argument("--allow-cpu", action="store_true", help="run on the CPU: a check of the script, not a figure")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        sys.exit("no CUDA device: this script measures GPU MFU; run the CPU suite with `make bench`")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    stalls: dict[str, dict | None] = {}
    for name in args.arm or ARMS:
        rows.append(measure_arm(name, ARMS[name], args))
        print(f"{name}: {json.dumps(rows[-1])}", flush=True)
        publish(args, rows, stalls)
    for mode in CHECKPOINT_MODES:
        stalls[mode] = checkpoint_stall(mode, args)
        print(f"checkpoint {mode}: {json.dumps(stalls[mode])}", flush=True)
        lines = publish(args, rows, stalls)
    print("\n".join(lines))


if __name__ == "__main__":
    with operator_session():  # a human runs the benchmark, as with `trainops bench`
        main()
