"""torchtitan: knobs are keys of its TOML job config (`torchtitan.<section.key>` overrides become
`--section.key value` on its command line), refusals restate its `ParallelDims` check and its
flag prerequisites (torchtitan is not installed here: its PyPI wheel pulls datasets, pyarrow,
tensorboard and wandb, so the documented rules are implemented instead), and its job is
`torchrun -m torchtitan.train --job.config_file CFG`."""
from __future__ import annotations

import re
from pathlib import Path

from trainops.tools.frameworks.adapter_base import SettingsAdapter, new_run_dir, number, write_command
from trainops.tools.frameworks.base import (
    FrameworkJob,
    FrameworkKnob,
    FrameworkRefused,
    ParseContext,
    SopPlan,
    StepRecord,
    mfu,
)
from trainops.tools.schedulers.base import JobSpec

DEFAULTS: dict[str, dict[str, object]] = {
    "torchtitan": {
        "parallelism.data_parallel_replicate_degree": 1, "parallelism.data_parallel_shard_degree": -1,
        "parallelism.tensor_parallel_degree": 1, "parallelism.pipeline_parallel_degree": 1,
        "parallelism.context_parallel_degree": 1, "parallelism.enable_async_tensor_parallel": False,
        "parallelism.pipeline_parallel_schedule": "1F1B", "activation_checkpoint.mode": "selective",
        "compile.enable": False, "training.local_batch_size": 8, "training.mixed_precision_param": "bfloat16",
        "checkpoint.enable": False, "checkpoint.interval": 500, "checkpoint.async_mode": "disabled",
    },
}


def _knob(name, category, key, values, effect, min_procs=1) -> FrameworkKnob:
    return FrameworkKnob(name=name, category=category, flag=f"--{key}", override=f"torchtitan.{key}", values=values,
                         expected_effect=effect, min_procs=min_procs)


KNOBS: list[FrameworkKnob] = [
    _knob("async_tp", "communication-overlap", "parallelism.enable_async_tensor_parallel", ("true", "false"),
          "micro-pipelines TP all-gather/reduce-scatter with the matmuls (needs tp > 1 and compile.enable)", 2),
    _knob("compile", "kernels", "compile.enable", ("true", "false"),
          "torch.compile per block: fused kernels, compile time up front"),
    _knob("mixed_precision_param", "kernels", "training.mixed_precision_param", ("bfloat16", "float32"),
          "FSDP2 parameter dtype for compute: bf16 halves all-gather bytes and uses tensor cores"),
    _knob("local_batch_size", "batch", "training.local_batch_size", ("1", "2", "4", "8", "16"),
          "per-rank batch: higher arithmetic intensity, more activation memory"),
    _knob("activation_checkpoint", "memory", "activation_checkpoint.mode", ("none", "selective", "full"),
          "recompute activations in backward: selective keeps matmul outputs, full recomputes blocks"),
    _knob("tp", "parallelism", "parallelism.tensor_parallel_degree", ("1", "2", "4", "8"),
          "tensor parallel degree; keep inside one NVLink domain", 2),
    _knob("pp", "parallelism", "parallelism.pipeline_parallel_degree", ("1", "2", "4", "8"), "pipeline stages", 2),
    _knob("pp_schedule", "parallelism", "parallelism.pipeline_parallel_schedule",
          ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"),
          "1F1B and zero-bubble schedules shrink the bubble against GPipe (needs pp > 1)", 2),
    _knob("dp_shard", "parallelism", "parallelism.data_parallel_shard_degree", ("-1", "1", "2", "4", "8"),
          "FSDP2 shard degree (-1: whatever the other degrees leave)", 2),
]

# torchtitan's MetricsProcessor.log line (colour codes stripped first):
#   "[titan] 2025-05-01 10:00:00,000 - root - INFO - step: 10  loss:  7.8312  grad_norm:  1.2345
#    memory: 42.30GiB(44.52%)  tps: 1,234  tflops: 71.45  mfu: 7.22%"   (older releases print "wps:" and no tflops)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"(?<!validate )step:\s*(\d+)\s")
_FIELDS = {
    "loss": re.compile(r"loss:\s*([-\d.]+)"),
    "tps": re.compile(r"(?:tps|wps):\s*([\d,.]+)"),
    "tflops": re.compile(r"tflops:\s*([\d,.]+)"),
    "mfu": re.compile(r"mfu:\s*([\d.]+)%"),
}


def check_rules(world_size: int, knobs: dict[str, object]) -> None:
    """ParallelDims: the degrees' product is the world size (-1 infers dp_shard); and flag prerequisites."""
    get = lambda key: knobs[f"parallelism.{key}"]  # noqa: E731
    rep, shard, cp, tp, pp = (int(get(k)) for k in ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                                                    "context_parallel_degree", "tensor_parallel_degree",
                                                    "pipeline_parallel_degree"))
    others = rep * cp * tp * pp
    if shard == -1:
        if world_size % others:
            raise FrameworkRefused(f"parallelism: WORLD_SIZE ({world_size}) is not divisible by dp_replicate({rep}) * "
                                   f"cp({cp}) * tp({tp}) * pp({pp}) = {others}, so data_parallel_shard_degree=-1 "
                                   "cannot be inferred; pick degrees whose product divides the number of processes")
        shard = world_size // others
    if rep * shard * cp * tp * pp != world_size:
        raise FrameworkRefused(f"parallelism: invalid parallel dims: dp_replicate({rep}) * dp_shard({shard}) * "
                               f"cp({cp}) * tp({tp}) * pp({pp}) != WORLD_SIZE({world_size}); set "
                               "data_parallel_shard_degree=-1 or change a degree")
    if knobs["parallelism.enable_async_tensor_parallel"] and tp == 1:
        raise FrameworkRefused("parallelism.enable_async_tensor_parallel=true needs tensor parallelism (got "
                               "tensor_parallel_degree=1); set tp >= 2 or drop async TP")
    if knobs["parallelism.enable_async_tensor_parallel"] and not knobs["compile.enable"]:
        raise FrameworkRefused("parallelism.enable_async_tensor_parallel=true: async TP requires torch.compile (got "
                               "compile.enable=false); set torchtitan.compile.enable=true")
    if pp == 1 and knobs["parallelism.pipeline_parallel_schedule"] != "1F1B":
        raise FrameworkRefused("parallelism.pipeline_parallel_schedule="
                               f"{knobs['parallelism.pipeline_parallel_schedule']!r} has no "
                               "effect with pipeline_parallel_degree=1; set pp >= 2 first")


class TorchtitanAdapter(SettingsAdapter):
    name = "torchtitan"
    display_name = "torchtitan"
    package = "torchtitan"
    knob_list = KNOBS
    defaults = DEFAULTS
    sop_plan = SopPlan(steps_key="torchtitan.training.steps", arms=("compile=true", "activation_checkpoint=none"),
                       drill=("torchtitan.checkpoint.enable=true", "torchtitan.checkpoint.interval=2"),
                       faults=("crash", "hang"))

    def validate(self, knob_values: dict[str, str], overrides: list[str] | None = None, world_size: int = 2) -> None:
        check_rules(world_size, self.settings(self.knob_overrides(knob_values, overrides))["torchtitan"])

    def build_job(self, job: FrameworkJob) -> JobSpec:
        """`job.config` is the torchtitan TOML (e.g. torchtitan/models/llama3/train_configs/debug_model.toml);
        overrides go on the command line, which torchtitan applies over the file."""
        if not job.config or not Path(job.config).is_file():
            raise FrameworkRefused(f"config: {job.config!r} is not a torchtitan job config; pass its TOML file "
                                   "(e.g. train_configs/debug_model.toml from a torchtitan checkout)")
        self.validate({}, job.overrides, job.nproc * job.nodes)
        settings = self.settings(job.overrides)
        run_dir = new_run_dir(self.name, settings)
        flags = []
        for key, value in settings["torchtitan"].items():
            flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
        command = ["-m", "torchtitan.train", "--job.config_file", job.config, "--job.dump_folder", str(run_dir), *flags]
        write_command(run_dir, command)
        return JobSpec(name=job.name, command=command, launcher="torchrun", nodes=job.nodes, procs_per_node=job.nproc,
                       run_dir=str(run_dir), env={"OMP_NUM_THREADS": "1"}, partition=job.partition)

    def parse_log_line(self, line: str, ctx: ParseContext | None = None) -> StepRecord | None:
        """torchtitan prints tps, tflops and MFU itself; no step time (it logs every log_freq steps)."""
        text = _ANSI.sub("", line)
        match = _STEP.search(text)
        if not match or "validate step" in text:
            return None
        found = {key: number(rx.search(text)) for key, rx in _FIELDS.items()}
        if found["loss"] is None:
            return None
        record = StepRecord(step=int(match.group(1)), loss=found["loss"], tokens_per_s=found["tps"],
                            tflops=found["tflops"], mfu_pct=found["mfu"])
        return mfu(record, ctx)

    def describe_layout(self, overrides: list[str], world_size: int) -> str:
        knobs = self.settings(overrides)["torchtitan"]
        dims = {name: knobs[f"parallelism.{key}"] for name, key in (
            ("dp_replicate", "data_parallel_replicate_degree"), ("dp_shard", "data_parallel_shard_degree"),
            ("cp", "context_parallel_degree"), ("tp", "tensor_parallel_degree"), ("pp", "pipeline_parallel_degree"))}
        return f"world={world_size} torchtitan " + " ".join(f"{name}={value}" for name, value in dims.items())

    def checkpoint_dir(self, run_dir: str) -> str:
        """`{job.dump_folder}/{checkpoint.folder}` with torchtitan's default folder name."""
        return str(Path(run_dir) / "checkpoint")
