"""DeepSpeed: knobs are keys of DeepSpeed's own JSON config (`deepspeed.<dotted.key>`), the job
is `torchrun -m trainops.tools.frameworks.deepspeed_train --run-dir RUN`, and every generated config
passes DeepSpeed's own `DeepSpeedConfig` (batch arithmetic, ZeRO schema) before launch.

Overrides (`section.key=value`): `model.preset`; `training.steps|global_batch|micro_batch|
seq_len|lr|seed`; `checkpoint.enable|interval|keep|mode` (mode: sync only, DeepSpeed's
`save_checkpoint` blocks); `deepspeed.<key>` for any DeepSpeed JSON key, e.g.
`deepspeed.zero_optimization.stage=2`."""
from __future__ import annotations

import contextlib
import json
import re
import sys
from pathlib import Path

from trainops.tools.frameworks.adapter_base import SettingsAdapter, new_run_dir
from trainops.tools.frameworks.base import (
    FrameworkJob,
    FrameworkKnob,
    FrameworkRefused,
    ParseContext,
    SopPlan,
    StepRecord,
    mfu,
)
from trainops.tools.frameworks.trainops_adapter import TrainopsAdapter
from trainops.tools.schedulers.base import JobSpec

SETTINGS: dict[str, dict[str, object]] = {
    "model": {"preset": "tiny"},
    "training": {"steps": 10, "global_batch": 8, "micro_batch": 2, "seq_len": 64, "lr": 1e-3, "seed": 0},
    "checkpoint": {"enable": False, "interval": 5, "keep": 2, "mode": "sync"},
    "deepspeed": {
        "zero_optimization.stage": 1,
        "zero_optimization.overlap_comm": False,
        "zero_optimization.contiguous_gradients": True,
        "zero_optimization.reduce_bucket_size": 500_000_000,
        "zero_optimization.allgather_bucket_size": 500_000_000,
        "zero_optimization.offload_optimizer.device": "none",
        "zero_optimization.offload_param.device": "none",
        "bf16.enabled": False,
        "gradient_clipping": 1.0,
        "steps_per_print": 1_000_000_000,
    },
}


def _knob(name, category, key, values, effect, min_procs=1) -> FrameworkKnob:
    return FrameworkKnob(name=name, category=category, flag=key, override=f"deepspeed.{key}", values=values,
                         expected_effect=effect, min_procs=min_procs)


KNOBS: list[FrameworkKnob] = [
    _knob("overlap_comm", "communication-overlap", "zero_optimization.overlap_comm", ("true", "false"),
          "overlaps ZeRO's gradient reduce with backward (needs ZeRO stage >= 1); more memory for buckets", 2),
    _knob("reduce_bucket_size", "communication-overlap", "zero_optimization.reduce_bucket_size",
          ("50000000", "200000000", "500000000"),
          "bigger buckets: fewer, larger reduce calls; smaller: earlier overlap", 2),
    _knob("allgather_bucket_size", "communication-overlap", "zero_optimization.allgather_bucket_size",
          ("50000000", "200000000", "500000000"), "bigger buckets: fewer all-gathers of updated partitions", 2),
    _knob("contiguous_gradients", "memory", "zero_optimization.contiguous_gradients", ("true", "false"),
          "copies gradients into one buffer as produced: less fragmentation, one extra copy"),
    _knob("precision", "kernels", "bf16.enabled", ("true", "false"),
          "bf16 halves bytes moved and uses tensor cores on GPUs; on CPUs often slower without AMX"),
    FrameworkKnob(name="micro_batch", category="batch", flag="train_micro_batch_size_per_gpu",
                  override="training.micro_batch", values=("1", "2", "4", "8"),
                  expected_effect="larger micro-batches raise arithmetic intensity and cut accumulation steps; cost "
                                  "activation memory"),
    _knob("zero_stage", "memory", "zero_optimization.stage", ("0", "1", "2", "3"),
          "1 shards optimizer state, 2 also gradients (reduce-scatter), 3 also parameters (all-gather per layer)"),
    _knob("offload_optimizer", "memory", "zero_optimization.offload_optimizer.device", ("none", "cpu"),
          "ZeRO-Offload: optimizer state and step on the CPU (needs ZeRO stage >= 1); frees GPU memory, costs PCIe "
          "time"),
    _knob("offload_param", "memory", "zero_optimization.offload_param.device", ("none", "cpu"),
          "ZeRO-Infinity parameter offload (needs ZeRO stage 3)"),
]

# DeepSpeed's own per-step lines (engine.print at steps_per_print, ThroughputTimer):
#   "[Rank 0] step=10, skipped=0, lr=[0.001], mom=[(0.9, 0.999)]"
#   "epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=35.2, CurrSamplesPerSec=36.1, MemAllocated=..."
_THROUGHPUT = re.compile(r"global_step=(?P<step>\d+), RunningAvgSamplesPerSec=[\d.]+, "
                         r"CurrSamplesPerSec=(?P<sps>[\d.]+)")


def ds_config(settings: dict[str, dict[str, object]]) -> dict:
    """The DeepSpeed JSON config: batch keys from [training], everything else from [deepspeed]."""
    config: dict = {"train_batch_size": settings["training"]["global_batch"],
                    "train_micro_batch_size_per_gpu": settings["training"]["micro_batch"],
                    "optimizer": {"type": "AdamW", "params": {"lr": settings["training"]["lr"], "torch_adam": True}}}
    for dotted, value in settings["deepspeed"].items():
        node = config
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return config


def check_rules(config: dict) -> None:
    """DeepSpeed's prerequisites between keys that its config class does not enforce itself."""
    zero = config.get("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    if zero.get("offload_optimizer", {}).get("device", "none") != "none" and stage < 1:
        raise FrameworkRefused(f"zero_optimization.offload_optimizer.device={zero['offload_optimizer']['device']!r} "
                               f"needs ZeRO stage >= 1 (got zero_optimization.stage={stage}); set --knob zero_stage=1 "
                               "or higher")
    if zero.get("offload_param", {}).get("device", "none") != "none" and stage != 3:
        raise FrameworkRefused(f"zero_optimization.offload_param.device={zero['offload_param']['device']!r} needs "
                               f"ZeRO stage 3 (got zero_optimization.stage={stage}); set zero_stage=3 or "
                               "offload_param=none")
    if zero.get("overlap_comm") and stage < 1:
        raise FrameworkRefused("zero_optimization.overlap_comm=true overlaps ZeRO's gradient reduction, which stage 0 "
                               "does not do (got zero_optimization.stage=0); set zero_stage=1 or higher, or "
                               "overlap_comm=false")


def validate_config(config: dict, world_size: int) -> None:
    """Our rules, then DeepSpeed's own `DeepSpeedConfig`. Without a process group DeepSpeedConfig
    sees one data-parallel rank, so it is given one rank's share of the global batch."""
    check_rules(config)
    batch = config["train_batch_size"]
    if batch % world_size:
        raise FrameworkRefused(f"training.global_batch={batch} is not divisible by the data-parallel world size "
                               f"({world_size}); use a multiple of {world_size}")
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's logger writes to stdout, which --json keeps clean
        from deepspeed.runtime.config import DeepSpeedConfig

        try:
            DeepSpeedConfig(json.loads(json.dumps({**config, "train_batch_size": batch // world_size})))
        except (AssertionError, ValueError, TypeError) as exc:
            raise FrameworkRefused("deepspeed config refused by DeepSpeedConfig (per data-parallel rank of "
                                   f"{world_size}): {' '.join(str(exc).split())[:400]}") from None


class DeepSpeedAdapter(SettingsAdapter):
    name = "deepspeed"
    display_name = "DeepSpeed"
    package = "deepspeed"
    knob_list = KNOBS
    defaults = SETTINGS
    sop_plan = SopPlan(job=("training.seq_len=64", "training.global_batch=8", "training.micro_batch=4"),
                       arms=("overlap_comm=true", "zero_stage=2"),
                       drill=("checkpoint.enable=true", "checkpoint.interval=2", "checkpoint.keep=50"),
                       faults=("crash", "hang", "checkpoint-corruption"))

    def settings(self, overrides: list[str]) -> dict[str, dict[str, object]]:
        """Defaults with the overrides applied; any DeepSpeed JSON key may be set under deepspeed."""
        settings = super().settings(overrides)
        if settings["checkpoint"]["mode"] != "sync":
            raise FrameworkRefused(f"checkpoint.mode={settings['checkpoint']['mode']!r}: DeepSpeed's save_checkpoint "
                                   "is synchronous in this adapter; use checkpoint.mode=sync")
        return settings

    def validate(self, knob_values: dict[str, str], overrides: list[str] | None = None, world_size: int = 2) -> None:
        validate_config(ds_config(self.settings(self.knob_overrides(knob_values, overrides))), world_size)

    def prepare_run(self, job: FrameworkJob) -> Path:
        """Validate, then write RUN/config.toml (trainops' view) and RUN/ds_config.json (DeepSpeed's)."""
        if job.config:
            raise FrameworkRefused(f"config: {job.config!r}: the deepspeed adapter takes --set overrides, not a config "
                                   "file; pass DeepSpeed keys as --set deepspeed.<key>=<value>")
        settings = self.settings([*([f"model.preset={job.preset}"] if job.preset else []), *job.overrides])
        config = ds_config(settings)
        validate_config(config, job.nproc * job.nodes)
        run_dir = new_run_dir(self.name, settings)
        (run_dir / "ds_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
        return run_dir

    def build_job(self, job: FrameworkJob) -> JobSpec:
        run_dir = self.prepare_run(job)
        return JobSpec(name=job.name,
                       command=["-m", "trainops.tools.frameworks.deepspeed_train", "--run-dir", str(run_dir)],
                       launcher="torchrun", nodes=job.nodes, procs_per_node=job.nproc, run_dir=str(run_dir),
                       env={"OMP_NUM_THREADS": "1"}, partition=job.partition)

    def parse_log_line(self, line: str, ctx: ParseContext | None = None) -> StepRecord | None:
        """The training script's line (trainops format, MFU included) or DeepSpeed's ThroughputTimer line
        (samples/s only: tokens/s, TFLOP/s and MFU are then computed with trainops' convention)."""
        record = TrainopsAdapter().parse_log_line(line, ctx)
        if record is not None:
            return record
        match = _THROUGHPUT.search(line)
        if not match:
            return None
        tokens_per_s = None
        if ctx is not None and ctx.seq_len:
            tokens_per_s = float(match["sps"]) * ctx.seq_len / ctx.world_size
        return mfu(StepRecord(step=int(match["step"]), tokens_per_s=tokens_per_s), ctx)

    def describe_layout(self, overrides: list[str], world_size: int) -> str:
        """What an MFU claim must name: ZeRO stage and offload over pure data parallelism."""
        zero = self.settings(overrides)["deepspeed"]
        offload = [f"offload_{what}={zero[f'zero_optimization.offload_{what}.device']}"
                   for what in ("optimizer", "param")
                   if zero[f"zero_optimization.offload_{what}.device"] != "none"]
        return " ".join([f"world={world_size} deepspeed data-parallel ZeRO-{zero['zero_optimization.stage']}",
                         *offload])
