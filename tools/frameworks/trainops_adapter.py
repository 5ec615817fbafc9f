"""The embedded trainer as one adapter among the others: its knobs are trainer config keys,
its job is `torchrun -m trainops.trainer.train --run-dir RUN`, and its log line is `format_line`."""
from __future__ import annotations

import re

from trainops.tools.frameworks.adapter_base import AdapterBase
from trainops.tools.frameworks.base import (
    FrameworkJob,
    FrameworkKnob,
    FrameworkRefused,
    ParseContext,
    SopPlan,
    StepRecord,
    mfu,
)
from trainops.tools.jobs.trainer_job import training_spec
from trainops.tools.schedulers.base import JobSpec, TrainingJob
from trainops.trainer.config import load_config

# trainer/metrics.py format_line: "step     5/12  loss 5.1234  grad_norm 1.234  step_time 85ms  tok/s 1,505 ..."
_LINE = re.compile(
    r"step\s+(?P<step>\d+)/\d+\s+loss (?P<loss>[-\d.e+naif]+)\s+grad_norm \S+\s+step_time (?P<ms>[\d.]+)ms\s+"
    r"tok/s (?P<tps>[\d,.]+)\s+tflops (?P<tflops>[\d.e+-]+)\s+mfu (?P<mfu>[\d.e+-]+)%")


def _knob(name, category, key, values, effect, min_procs=1) -> FrameworkKnob:
    return FrameworkKnob(name=name, category=category, flag=key, override=key, values=values,
                         expected_effect=effect, min_procs=min_procs)


KNOBS: list[FrameworkKnob] = [  # the embedded trainer's ablation knobs: the one list, which skills/knobs.py serves
    _knob("reshard_after_forward", "communication-overlap", "parallel.reshard_after_forward", ("true", "false"),
          "false keeps gathered FSDP parameters for backward (ZeRO-2): one all-gather fewer per layer, more memory"),
    _knob("comm_overlap", "communication-overlap", "parallel.comm_overlap", ("true", "false"),
          "overlaps TP collectives with the GEMMs (async TP); MegaScale's largest single gain (needs tp > 1)", 2),
    _knob("data_parallel", "communication-overlap", "parallel.data_parallel", ("fsdp", "ddp"),
          "ddp replicates weights and overlaps bucketed all-reduce with backward; faster for small models, more "
          "memory"),
    _knob("cpu_collectives", "communication-overlap", "parallel.cpu_collectives", ("auto", "gloo", "shared_memory"),
          "on one CPU host, shared memory instead of gloo's TCP for the data-parallel collectives: a 12 MB "
          "reduce-scatter 14 -> 3 ms, ~4% of a step at the issue-17 shape", 2),
    _knob("compile", "kernels", "training.compile", ("true", "false"),
          "torch.compile fuses elementwise kernels per block (~4% of a CPU step, more on GPUs); compile time "
          "dominates short runs, so the default, auto, compiles runs of 1000+ steps"),
    _knob("precision", "kernels", "training.precision", ("fp32", "bf16"),
          "bf16 halves bytes moved and uses tensor cores on GPUs; on CPUs often slower without AMX"),
    _knob("data_kind", "data-pipeline", "data.kind", ("text", "synthetic"),
          "synthetic tokens skip reading and tokenising: the gain bounds what a faster data pipeline can give"),
    _knob("micro_batch", "batch", "training.micro_batch", ("1", "2", "4", "8"),
          "larger micro-batches raise arithmetic intensity and cut accumulation steps; costs activation memory"),
    _knob("activation_checkpointing", "memory", "training.activation_checkpointing", ("none", "selective", "full"),
          "recomputes activations in backward: saves memory, costs ~1/3 more compute for full"),
    _knob("pp_schedule", "parallelism", "parallel.pp_schedule",
          ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"),
          "1F1B and zero-bubble schedules shrink the pipeline bubble against GPipe (needs pp > 1)", 2),
    _knob("tp", "parallelism", "parallel.tp", ("1", "2"),
          "tensor parallel degree N: splits each GEMM, adds two collectives per block; keep it inside one scale-up "
          "domain", 2),
    _knob("sequence_parallel", "parallelism", "parallel.sequence_parallel", ("true", "false"),
          "with tp > 1, shards norms along the sequence: less activation memory, reduce-scatter/all-gather instead "
          "of all-reduce", 2),
]


class TrainopsAdapter(AdapterBase):
    name = "trainops"
    display_name = "trainops-embedded-trainer"
    package = "trainops"
    knob_list = KNOBS
    sop_plan = SopPlan(job=("training.seq_len=64", "training.global_batch=8", "training.micro_batch=4"),
                       arms=("data_parallel=ddp", "data_kind=synthetic"),
                       drill=("checkpoint.enable=true", "checkpoint.interval=2", "checkpoint.mode=async",
                              "checkpoint.keep=50"),
                       faults=("crash", "hang", "bitflip"))

    def validate(self, knob_values: dict[str, str], overrides: list[str] | None = None, world_size: int = 2) -> None:
        """Knob names and values, then the trainer's own config validation (types, allowed values)."""
        merged_overrides = self.knob_overrides(knob_values, overrides)
        try:
            load_config(None, "tiny", merged_overrides)
        except ValueError as exc:
            raise FrameworkRefused(str(exc).splitlines()[0]) from None

    def build_job(self, job: FrameworkJob) -> JobSpec:
        req = TrainingJob(config=job.config, preset=None if job.config else job.preset, overrides=job.overrides,
                              nproc=job.nproc, nodes=job.nodes)
        try:
            return training_spec(req, job.name, [])
        except ValueError as exc:
            raise FrameworkRefused(str(exc).splitlines()[0]) from None

    def parse_log_line(self, line: str, ctx: ParseContext | None = None) -> StepRecord | None:
        match = _LINE.search(line)
        if not match:
            return None
        record = StepRecord(step=int(match["step"]), loss=float(match["loss"]), step_time_s=float(match["ms"]) / 1e3,
                            tokens_per_s=float(match["tps"].replace(",", "")), tflops=float(match["tflops"]),
                            mfu_pct=float(match["mfu"]))
        return mfu(record, ctx)

    def describe_layout(self, overrides: list[str], world_size: int) -> str:
        """Every parallel.* override and the world size (the SOP's own wording)."""
        parallel = [o.removeprefix("parallel.") for o in overrides if o.startswith("parallel.")]
        return (" ".join([f"world={world_size}", *parallel]) if parallel
                else f"world={world_size} fsdp dp_shard={world_size}")
