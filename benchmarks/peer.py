"""The embedded trainer against the peer a user would otherwise pick: DeepSpeed ZeRO-2 (and ZeRO-1)
training Hugging Face's LlamaForCausalLM of the same shape, batch, optimizer and precision on 2 gloo
processes (benchmarks/peer_deepspeed.py). Each repeat runs every arm back to back, so a ratio pairs
two runs made seconds apart. `python -m trainops.benchmarks.peer` rewrites its own section of
RESULTS.md; `trainops bench` includes it.

What differs between the arms, besides the framework: the model code (trainops' Llama with complex
RoPE vs transformers' rotate-half RoPE; both use torch's SDPA flash kernel and GQA without copies
in trainops, repeated K/V in transformers), the sharding (FSDP2 DTensors vs DeepSpeed's flat fp32
partitions), the AdamW kernel (torch's fused one per parameter shard vs torch's default over
DeepSpeed's one flat partition), the transport (the trainer moves a CPU run's gradients and parameters between the
ranks of one host through shared memory, `parallel.cpu_collectives=auto`; DeepSpeed through gloo's
TCP, as the trainer does in the arm with gloo's collectives), and the trainer's per-step duties
(metrics record, heartbeat, replica checksum, deterministic algorithms), all left on as users run
them. The target arm runs the trainer's blocks compiled, as `training.compile=auto` trains any run of
1000 steps or more; the eager arms are what shorter runs get. Both frameworks are also compared
compiled (`training.compile`, DeepSpeed's `engine.compile()`)."""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from trainops.benchmarks.harness import CRASHED_RUNS, Figure, Suite, ratios, render, torchrun_step_time, write_section
from trainops.benchmarks.harness import trainer_step_time as harness_trainer_step_time
from trainops.benchmarks.peer_deepspeed import CLIP, LR, MICRO_BATCH, SEQ_LEN, SHAPE, WEIGHT_DECAY, hf_llama
from trainops.tools.context import operator_session

BEGIN, END = "<!-- peer:begin -->", "<!-- peer:end -->"
NPROC = 2
TRAINER_SHAPE = [*(f"model.{key}={value}" for key, value in SHAPE.items()), "model.tie_embeddings=false",
                 f"training.seq_len={SEQ_LEN}", f"training.micro_batch={MICRO_BATCH}",
                 f"training.global_batch={MICRO_BATCH * NPROC}", f"training.lr={LR}",
                 f"training.weight_decay={WEIGHT_DECAY}", f"training.max_grad_norm={CLIP}", "training.precision=fp32",
                 "data.kind=synthetic"]
FSDP_EAGER = ["parallel.data_parallel=fsdp", "training.compile=false"]
# (figure, trainer overrides, the DeepSpeed run it is compared with: ZeRO stage, compiled)
ARMS = [
    ("trainer FSDP2 as a long run trains by default (compiled) / DeepSpeed ZeRO-2 step time",
     ["parallel.data_parallel=fsdp", "training.compile=true"], (2, False)),
    ("trainer FSDP2 eager, a short run's default / DeepSpeed ZeRO-2 step time", FSDP_EAGER, (2, False)),
    ("trainer FSDP2 eager without reshard-after-forward / DeepSpeed ZeRO-2 step time",
     [*FSDP_EAGER, "parallel.reshard_after_forward=false"], (2, False)),
    ("trainer FSDP2 eager with gloo's collectives / DeepSpeed ZeRO-2 step time",
     [*FSDP_EAGER, "parallel.cpu_collectives=gloo"], (2, False)),
    ("trainer DDP eager / DeepSpeed ZeRO-1 step time", ["parallel.data_parallel=ddp", "training.compile=false"],
     (1, False)),
    ("trainer FSDP2 compiled / DeepSpeed ZeRO-2 compiled step time",
     ["parallel.data_parallel=fsdp", "training.compile=true"], (2, True)),
]
"""The first arm is the trainer as `training.compile=auto` runs a job of AUTO_COMPILE_MIN_STEPS steps
or more (compiled blocks), measured in its steady state; DeepSpeed as users run it (eager). The
eager arms are what a shorter run gets; the last arm compiles both."""
DUTIES_OFF = ["metrics.param_checksum=false", "metrics.heartbeat=false", "training.deterministic=false"]
"""The trainer's per-step duties, all on by default: replica checksum, heartbeat, deterministic
algorithms, turned off together in one arm to report what they cost (the metrics record stays:
the benchmark reads its step times from it)."""
TARGETS = {ARMS[0][0]: 0.90}  # issue 17: the trainer's step <= 0.90x DeepSpeed ZeRO-2's, as each runs by default


def hf_llama_parameters() -> int:
    """Parameters of the peer's model, built on the meta device (no memory, no weights)."""
    import torch

    with torch.device("meta"):
        return sum(p.numel() for p in hf_llama().parameters())


def trainer_step_time(steps: int, extra: list[str]) -> float:
    """Median steady-state iteration time of `trainops train` on the peer shape (rank 0)."""
    return harness_trainer_step_time([*TRAINER_SHAPE, f"training.steps={steps}", *extra], NPROC)


def deepspeed_step_time(zero: int, steps: int, compiled: bool = False) -> float:
    """Median steady-state step time of DeepSpeed ZeRO-`zero` on the same shape (rank 0)."""
    program = ["-m", "trainops.benchmarks.peer_deepspeed", "--zero", str(zero), "--steps", str(steps)]
    return torchrun_step_time(program + ["--compile"] * compiled, NPROC, f"DeepSpeed ZeRO-{zero}", rerun_on_crash=True)


def floor_step_time(steps: int) -> float:
    """The same model and batch on the same processes with no communication at all (each rank
    trains a replica of its own): no data-parallel step of this model can be faster."""
    return torchrun_step_time(["-m", "trainops.benchmarks.plain_loop", "--preset", "tiny",
                               *(f"--set={key}={value}" for key, value in SHAPE.items()), "--seq-len", str(SEQ_LEN),
                               "--micro-batch", str(MICRO_BATCH), "--no-sync", "--steps", str(steps)],
                              NPROC, "the no-communication floor", rerun_on_crash=True)


def bench_peer(suite: Suite, repeats: int, steps: int) -> None:
    """Per repeat, one after the other: each DeepSpeed run, then the trainer arms set against it
    (after ZeRO-2: the compute floor and the trainer without its duties too)."""
    first_figure = len(suite.figures)
    peers: dict[tuple[int, bool], list[float]] = {peer: [] for _, _, peer in ARMS}
    trainer: dict[str, list[float]] = {name: [] for name, _, _ in ARMS}
    floor: list[float] = []
    bare: list[float] = []
    for _ in range(repeats):
        for peer in peers:
            peers[peer].append(deepspeed_step_time(peer[0], steps, compiled=peer[1]))
            if peer == (2, False):
                floor.append(floor_step_time(steps))
                bare.append(trainer_step_time(steps, [*FSDP_EAGER, *DUTIES_OFF]))
            for name, extra, against in ARMS:
                if against == peer:
                    trainer[name].append(trainer_step_time(steps, extra))
    for name, _, (zero, compiled) in ARMS:
        peer = peers[(zero, compiled)]
        fig = suite.add(Figure(name, ratios(trainer[name], peer), "x",
                               target=f"<= {TARGETS[name]:.2f}" if name in TARGETS else ""))
        fig.passed = fig.median <= TARGETS[name] if name in TARGETS else None
        fig.note = (f"step time trainer {statistics.median(trainer[name]) * 1000:.0f} ms vs DeepSpeed ZeRO-{zero}"
                    f"{' compiled' if compiled else ''} {statistics.median(peer) * 1000:.0f} ms (dim {SHAPE['dim']}, "
                    f"{SHAPE['n_layers']} layers, {SHAPE['n_heads']}/{SHAPE['n_kv_heads']} heads, FFN "
                    f"{SHAPE['ffn_hidden_dim']}, seq {SEQ_LEN}, micro-batch {MICRO_BATCH}, fp32, {NPROC} processes "
                    "on gloo process groups, 1 thread each)")
    duties = trainer[ARMS[1][0]]
    cost = suite.add(Figure("trainer FSDP2 eager step with its per-step duties / without them", ratios(duties, bare),
                            "x"))
    cost.note = ("duties: replica checksum, heartbeat, deterministic algorithms, all on by "
                 f"default; step {statistics.median(duties) * 1000:.0f} ms with, {statistics.median(bare) * 1000:.0f} "
                 "ms without")
    fig = suite.add(Figure("compute floor (the trainer's model, no communication) / DeepSpeed ZeRO-2 step time",
                           ratios(floor, peers[(2, False)]), "x"))
    fig.note = (f"{statistics.median(floor) * 1000:.0f} ms: the two processes share the two cores, so this is "
                "the fastest any data-parallel step of this model can be here; a ratio below it would need "
                "faster kernels than transformers' model uses (the same torch SDPA and GEMMs)")
    if CRASHED_RUNS:
        for figure in suite.figures[first_figure:]:
            figure.note += f"; runs that died and were run again: {', '.join(CRASHED_RUNS)}"


def run_and_publish(repeats: int, steps: int) -> tuple[Suite, Path]:
    """Measure and rewrite this benchmark's own section of RESULTS.md (`trainops bench` runs it too)."""
    suite = Suite()
    bench_peer(suite, repeats, steps)
    title = "## Against DeepSpeed at equal math (`python -m trainops.benchmarks.peer`)"
    return suite, write_section(render(suite, title, BEGIN, END), BEGIN, END)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as home:
        os.environ["TRAINOPS_HOME"] = home
        suite, path = run_and_publish(args.repeats, args.steps)
    for fig in suite.figures:
        print(f"{fig.name}: median {fig.median:.3f}x (spread {fig.spread[0]:.3f} ~ {fig.spread[1]:.3f}) {fig.note}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    with operator_session():  # a human runs the benchmark, as with `trainops bench`
        raise SystemExit(main())
