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
import statistics
import sys
import time
from pathlib import Path

import torch

from trainops.benchmarks.harness import GPU_BEGIN, GPU_END, write_section
from trainops.trainer.config import load_config
from trainops.trainer.launch import read_metrics, run_local

ARMS = {
    "bf16 eager": [],
    "bf16 compile": ["training.compile=true"],
    "bf16 compile + selective AC": ["training.compile=true", "training.activation_checkpointing=selective"],
}


def _shape(args) -> list[str]:
    return ["training.precision=bf16", "data.kind=synthetic", f"training.seq_len={args.seq_len}",
            f"training.global_batch={args.batch}", f"training.micro_batch={args.batch}",
            f"training.steps={args.steps}", "training.deterministic=false", "training.warmup_steps=2"]


def measure_arm(name: str, overrides: list[str], args) -> dict:
    cfg = load_config(None, args.preset, [*_shape(args), *overrides])
    started = time.time()
    result = run_local(cfg, 1, show_progress=False)
    if result.status != "ok":
        return {"arm": name, "status": "failed", "run_dir": result.run_dir}
    steady = [r for r in read_metrics(result.run_dir) if r["rank"] == 0 and r["step"] > args.warmup]
    return {
        "arm": name, "status": "ok", "run_dir": result.run_dir, "wall_s": time.time() - started,
        "mfu_pct": statistics.median(r["mfu_pct"] for r in steady),
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady),
        "step_time_s": statistics.median(r["step_time_s"] for r in steady),
        "peak_mem_gib": max(r["peak_mem_gib"] for r in steady),
        "peak_source": steady[-1].get("peak_source"),
    }


def checkpoint_stall(mode: str, args) -> float | None:
    cfg = load_config(None, args.preset, [*_shape(args), "training.steps=6", "checkpoint.enable=true",
                                          "checkpoint.interval=2", f"checkpoint.mode={mode}"])
    result = run_local(cfg, 1, show_progress=False)
    journal = Path(result.run_dir) / "checkpoints.jsonl"
    if result.status != "ok" or not journal.exists():
        return None
    stalls = [json.loads(line)["stall_s"] for line in journal.read_text().splitlines()
              if json.loads(line).get("event") == "save"]
    return statistics.median(stalls) if stalls else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="benchmarks/gpu-results")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10, help="steps excluded (compile happens here)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--preset", default="llama3-1b")
    parser.add_argument("--arm", action="append", choices=list(ARMS), help="measure only these arms (repeatable)")
    parser.add_argument("--allow-cpu", action="store_true", help="run on the CPU: a check of the script, not a figure")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.allow_cpu:
        sys.exit("no CUDA device: this script measures GPU MFU; run the CPU suite with `make bench`")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = [measure_arm(name, ARMS[name], args) for name in args.arm or ARMS]
    stalls = {mode: checkpoint_stall(mode, args) for mode in ("sync", "async", "async_pinned")}
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (script check, not a figure)"
    report = {"gpu": device, "torch": torch.__version__, "cuda": torch.version.cuda,
              "model": f"{args.preset} preset", "seq_len": args.seq_len, "batch": args.batch, "arms": rows,
              "checkpoint_stall_s": stalls}
    (out / "gpu-results.json").write_text(json.dumps(report, indent=2))
    lines = [f"# GPU MFU — {report['gpu']}, torch {report['torch']} (CUDA {report['cuda']})", "",
             f"{args.preset} preset, bf16, seq {args.seq_len}, batch {args.batch}, median over steps > {args.warmup}", "",
             "| arm | MFU | tokens/s/GPU | step time | peak memory |", "|---|---|---|---|---|"]
    for row in rows:
        if row["status"] != "ok":
            lines.append(f"| {row['arm']} | failed: read {row['run_dir']}/logs | | | |")
            continue
        lines.append(f"| {row['arm']} | {row['mfu_pct']:.1f}% | {row['tokens_per_s']:.0f} | "
                     f"{row['step_time_s'] * 1000:.0f} ms | {row['peak_mem_gib']:.1f} GiB |")
    lines.append("")
    sync_s = stalls["sync"]
    for mode in ("async", "async_pinned"):
        if sync_s and stalls[mode] is not None:
            lines.append(f"Checkpoint stall {mode}: {stalls[mode]:.3f} s vs sync {sync_s:.3f} s "
                         f"(ratio {stalls[mode] / sync_s:.3f}, target <= 0.10).")
        else:
            lines.append(f"Checkpoint stall {mode}: not measured (a run failed; read its logs under $TRAINOPS_HOME/runs).")
    (out / "gpu-results.md").write_text("\n".join(lines) + "\n")
    if torch.cuda.is_available():  # a real figure: it replaces the GPU section of RESULTS.md
        body = "\n".join(["## GPU (`benchmarks/gpu.sh`)", "", *lines[2:]])
        write_section(f"{GPU_BEGIN}\n{body}\n{GPU_END}", GPU_BEGIN, GPU_END)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
