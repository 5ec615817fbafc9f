"""Where a training step goes, from a torch.profiler Chrome trace: each operator's own time (its
duration less its children's) is put in the category of its outermost recognised ancestor —
optimizer, communication (FSDP, c10d, gloo, NCCL), trainer duties (metrics record, checksum,
heartbeat, clipping), compute (forward, backward, loss) — and the time no operator covers is
Python between operators. `python -m trainops.benchmarks.step_profile` profiles the trainer's
FSDP2 step and DeepSpeed ZeRO-2's on the peer shape (benchmarks/peer.py) and prints both."""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

from trainops.benchmarks.harness import run_trainer, torchrun_step_time
from trainops.benchmarks.peer import TRAINER_SHAPE
from trainops.tools.context import operator_session

CATEGORIES = ("compute", "communication", "optimizer", "clipping and duties", "Python between operators")
_RULES = (  # (name prefix, category): the outermost matching event decides
    ("Optimizer.step", "optimizer"), ("Optimizer.zero_grad", "optimizer"),
    ("FSDP::", "communication"), ("c10d::", "communication"), ("gloo:", "communication"),
    ("nccl:", "communication"), ("_c10d_functional", "communication"), ("record_param_comms", "communication"),
    ("trainops::", "clipping and duties"), ("aten::linalg_vector_norm", "clipping and duties"),
    ("aten::_foreach_norm", "clipping and duties"),
)


def _category(name: str) -> str | None:
    return next((category for prefix, category in _RULES if name.startswith(prefix)), None)


def breakdown(trace: Path, step_marker: str = "train_step#") -> dict[str, float]:
    """Milliseconds per category per step, over the iterations between consecutive step markers
    on the thread that runs them (a step's duties after its marked range included)."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("ph") == "X"]
    steps = sorted((e for e in events if e["name"].startswith(step_marker)), key=lambda e: e["ts"])
    if len(steps) < 2:
        raise ValueError(f"{trace}: needs two or more {step_marker} ranges, found {len(steps)}")
    tid = steps[0]["tid"]
    start, end = steps[0]["ts"], steps[-1]["ts"]
    ops = sorted((e for e in events if e["tid"] == tid and start <= e["ts"] < end
                  and not e["name"].startswith(step_marker)), key=lambda e: (e["ts"], -e["dur"]))
    totals: Counter[str] = Counter()
    stack: list[tuple[dict, str | None, list[float]]] = []  # (event, inherited category, children time)
    for event in [*ops, None]:
        while stack and (event is None or event["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]):
            done, category, children = stack.pop()
            totals[category or "compute"] += done["dur"] - children[0]
            if stack:
                stack[-1][2][0] += done["dur"]
        if event is not None:
            inherited = stack[-1][1] if stack else None
            stack.append((event, inherited or _category(event["name"]), [0.0]))
    covered = sum(totals.values())
    totals["Python between operators"] += max(0.0, (end - start) - covered)
    return {category: totals[category] / 1000 / (len(steps) - 1) for category in CATEGORIES}


def profile_trainer(steps: list[int]) -> Path:
    run_dir = run_trainer([*TRAINER_SHAPE, f"training.steps={steps[-1] + 1}",
                           f"metrics.profile_steps={steps[0]},{len(steps)}"], 2)
    return run_dir / "profile" / "rank0.json"


def profile_deepspeed(steps: list[int], folder: Path) -> Path:
    trace = folder / "deepspeed-rank0.json"
    torchrun_step_time(["-m", "trainops.benchmarks.peer_deepspeed", "--zero", "2", "--steps", str(steps[-1] + 1),
                        "--profile-steps", f"{steps[0]},{len(steps)}", "--trace", str(trace)], 2, "profiled DeepSpeed")
    return trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", default="15,4", help="first profiled step and how many (default 15,4)")
    args = parser.parse_args(argv)
    first, count = (int(x) for x in args.steps.split(","))
    steps = list(range(first, first + count))
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["TRAINOPS_HOME"] = tmp
        rows = {"trainer FSDP2": breakdown(profile_trainer(steps)),
                "DeepSpeed ZeRO-2": breakdown(profile_deepspeed(steps, Path(tmp)))}
    print("| ms per step | " + " | ".join(rows) + " |\n|---|" + "---|" * len(rows))
    for category in CATEGORIES:
        print(f"| {category} | " + " | ".join(f"{row[category]:.1f}" for row in rows.values()) + " |")
    print("| total | " + " | ".join(f"{sum(row.values()):.1f}" for row in rows.values()) + " |")
    return 0


if __name__ == "__main__":
    with operator_session():  # a human runs the benchmark, as with `trainops bench`
        raise SystemExit(main())
