"""Megatron-LM: knobs are its command-line flags (`megatron.<flag_with_underscores>` overrides
become `--flag-with-dashes`), refusals follow `megatron/training/arguments.py::validate_args`
(which megatron-core's wheel does not ship, so the rules are restated here with its messages),
then megatron-core's own `TransformerConfig` checks the model-parallel and recompute settings
where megatron-core is installed. The job runs Megatron-LM's `pretrain_gpt.py` under torchrun."""
from __future__ import annotations

import re
import warnings
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
from trainops.trainer.model_args import preset as model_preset

DEFAULTS: dict[str, dict[str, object]] = {
    "model": {"preset": "tiny"},
    "training": {"steps": 10, "global_batch": 8, "seq_len": 64, "lr": 1e-3},
    "checkpoint": {"enable": False, "interval": 5},
    "megatron": {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
                 "micro_batch_size": 1, "sequence_parallel": False, "tp_comm_overlap": False,
                 "overlap_grad_reduce": False, "overlap_param_gather": False, "use_distributed_optimizer": False,
                 "recompute_granularity": "none", "bf16": False},
}


def _knob(name, category, values, effect, min_procs=1) -> FrameworkKnob:
    return FrameworkKnob(name=name, category=category, flag="--" + name.replace("_", "-"), override=f"megatron.{name}",
                         values=values, expected_effect=effect, min_procs=min_procs)


KNOBS: list[FrameworkKnob] = [
    _knob("tp_comm_overlap", "communication-overlap", ("true", "false"),
          "overlaps TP all-gather/reduce-scatter with the GEMMs (needs --sequence-parallel and tp > 1); MegaScale's "
          "largest single gain", 2),
    _knob("overlap_grad_reduce", "communication-overlap", ("true", "false"),
          "overlaps the data-parallel gradient reduce with backward", 2),
    _knob("overlap_param_gather", "communication-overlap", ("true", "false"),
          "overlaps the distributed optimizer's parameter all-gather with forward (needs --use-distributed-optimizer "
          "and --overlap-grad-reduce)", 2),
    _knob("bf16", "kernels", ("true", "false"), "bf16 GEMMs on tensor cores; halves bytes moved"),
    _knob("micro_batch_size", "batch", ("1", "2", "4", "8"),
          "larger micro-batches raise arithmetic intensity and shrink the pipeline bubble share; cost activation "
          "memory"),
    _knob("use_distributed_optimizer", "memory", ("true", "false"),
          "shards optimizer state across data-parallel ranks (ZeRO-1)"),
    _knob("recompute_granularity", "memory", ("none", "selective", "full"),
          "selective recomputes attention's core only (cheap); full recomputes whole layers (needs "
          "--recompute-method)"),
    _knob("tensor_model_parallel_size", "parallelism", ("1", "2", "4", "8"),
          "splits each GEMM over N GPUs; two collectives per layer; keep it inside one NVLink domain", 2),
    _knob("pipeline_model_parallel_size", "parallelism", ("1", "2", "4", "8"),
          "splits layers into N stages; bubble (p-1)/(m+p-1) for m micro-batches", 2),
    _knob("sequence_parallel", "parallelism", ("true", "false"),
          "with tp > 1, shards norms and dropout along the sequence: less activation memory", 2),
]

_ITERATION = re.compile(r"iteration\s+(?P<step>\d+)/\s*\d+")
# Megatron-LM's training_log line, and Megatron-DeepSpeed's variant ("TFLOPs: ", "tgs"):
#   " [2025-10-06 03:27:07] iteration       10/      10 | consumed samples: 5120 |
#    elapsed time per iteration (ms): 4647.8 | throughput per GPU (TFLOP/s/GPU): 412.3 | learning rate: 1.5E-06 |
#    global batch size:   512 | lm loss: 9.763827E+00 | ..."
_FIELDS = {
    "ms": re.compile(r"elapsed time per iteration \(ms\):\s*([\d.,]+)"),
    "tflops": re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.,]+)|TFLOPs:\s*([\d.,]+)"),
    "loss": re.compile(r"lm loss:\s*([-\d.E+e]+)"),
    "gbs": re.compile(r"global batch size:\s*(\d+)"),
    "tps": re.compile(r"tokens/sec/gpu:\s*([\d.,]+)|tokens per gpu per second \(tgs\):\s*([\d.,]+)"),
}


def check_rules(world_size: int, flags: dict[str, object], model_layers: int) -> None:
    """validate_args' rules between flags, with its wording, before any process starts."""
    tp, pp, cp = (int(flags[k]) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                          "context_parallel_size"))
    if world_size % (tp * pp * cp):
        raise FrameworkRefused(f"--tensor-model-parallel-size: world_size ({world_size}) is not divisible by "
                               f"tensor_model_parallel_size ({tp}) times pipeline_model_parallel_size ({pp}) times "
                               f"context_parallel_size ({cp}); pick degrees whose product divides the number of "
                               "processes")
    if pp > 1 and model_layers % pp:
        raise FrameworkRefused(f"--pipeline-model-parallel-size={pp}: number of layers ({model_layers}) should be "
                               "divisible by the pipeline-model-parallel size; choose a divisor of the layer count")
    if flags["tp_comm_overlap"] and not flags["sequence_parallel"]:
        raise FrameworkRefused("--tp-comm-overlap: tensor parallel communication/GEMM overlap can happen only when "
                               "sequence parallelism is enabled; add --sequence-parallel "
                               "(megatron.sequence_parallel=true) or drop the overlap")
    if flags["tp_comm_overlap"] and tp == 1:
        raise FrameworkRefused("--tp-comm-overlap needs tensor parallelism (got --tensor-model-parallel-size=1); "
                               "set tensor_model_parallel_size >= 2 or drop the overlap")
    if flags["overlap_param_gather"] and not flags["use_distributed_optimizer"]:
        raise FrameworkRefused("--overlap-param-gather only supported with distributed optimizer; add "
                               "--use-distributed-optimizer (megatron.use_distributed_optimizer=true)")
    if flags["overlap_param_gather"] and not flags["overlap_grad_reduce"]:
        raise FrameworkRefused("--overlap-param-gather: must use --overlap-param-gather with --overlap-grad-reduce; "
                               "add megatron.overlap_grad_reduce=true")


def core_config_check(flags: dict[str, object], preset: str) -> None:
    """megatron-core's own TransformerConfig validation (sequence parallel without TP, recompute
    method, head/group divisibility), when megatron-core imports here."""
    try:
        with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed": expected on a CPU host
            warnings.simplefilter("ignore")
            from megatron.core.transformer import TransformerConfig
    except ImportError:
        return

    args = model_preset(preset)
    granularity = flags["recompute_granularity"]
    try:
        TransformerConfig(
            num_layers=args.n_layers, hidden_size=args.dim, num_attention_heads=args.n_heads,
            num_query_groups=args.kv_heads, ffn_hidden_size=args.ffn_hidden_dim,
            tensor_model_parallel_size=int(flags["tensor_model_parallel_size"]),
            pipeline_model_parallel_size=int(flags["pipeline_model_parallel_size"]),
            context_parallel_size=int(flags["context_parallel_size"]),
            sequence_parallel=bool(flags["sequence_parallel"]),
            recompute_granularity=None if granularity == "none" else granularity,
            recompute_method=flags.get("recompute_method"), recompute_num_layers=flags.get("recompute_num_layers"),
            bf16=bool(flags["bf16"]))
    except (ValueError, AssertionError, TypeError) as exc:
        raise FrameworkRefused("megatron-core TransformerConfig refused the flags: "
                               f"{' '.join(str(exc).split())}") from None


def command_flags(settings: dict[str, dict[str, object]], run_dir: str) -> list[str]:
    """pretrain_gpt.py's arguments: model shape from the trainops preset, mock data, the knobs' flags."""
    args, training = model_preset(str(settings["model"]["preset"])), settings["training"]
    out = ["--num-layers", args.n_layers, "--hidden-size", args.dim, "--num-attention-heads", args.n_heads,
           "--group-query-attention", "--num-query-groups", args.kv_heads, "--ffn-hidden-size", args.ffn_hidden_dim,
           "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
           "--seq-length", training["seq_len"], "--max-position-embeddings", training["seq_len"],
           "--train-iters", training["steps"], "--global-batch-size", training["global_batch"], "--lr", training["lr"],
           "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", args.vocab_size,
           "--log-interval", 1, "--log-throughput"]
    for name, value in settings["megatron"].items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is not False and not (name == "recompute_granularity" and value == "none"):
            out += [flag, value]
    if settings["checkpoint"]["enable"]:
        folder = str(Path(run_dir) / "checkpoints")
        out += ["--save", folder, "--load", folder, "--save-interval", settings["checkpoint"]["interval"]]
    return [str(x) for x in out]


class MegatronAdapter(SettingsAdapter):
    name = "megatron"
    display_name = "Megatron-LM"
    package = "megatron-core"
    knob_list = KNOBS
    defaults = DEFAULTS
    sop_plan = SopPlan(job=("training.seq_len=64", "training.global_batch=8"),
                       arms=("overlap_grad_reduce=true", "use_distributed_optimizer=true"),
                       drill=("checkpoint.enable=true", "checkpoint.interval=2"), faults=("crash", "hang"))

    def validate(self, knob_values: dict[str, str], overrides: list[str] | None = None, world_size: int = 2) -> None:
        settings = self.settings(self.knob_overrides(knob_values, overrides))

        preset = str(settings["model"]["preset"])
        check_rules(world_size, settings["megatron"], model_preset(preset).n_layers)
        core_config_check(settings["megatron"], preset)

    def build_job(self, job: FrameworkJob) -> JobSpec:
        """`job.config` is the path of Megatron-LM's pretrain_gpt.py (Megatron-LM is a source checkout, not a wheel)."""
        if not job.config or not Path(job.config).is_file():
            raise FrameworkRefused(f"config: {job.config!r} is not Megatron-LM's pretrain_gpt.py; pass the path of the "
                                   "script in a Megatron-LM checkout (git clone https://github.com/NVIDIA/Megatron-LM)")
        overrides = [*([f"model.preset={job.preset}"] if job.preset else []), *job.overrides]
        self.validate({}, overrides, job.nproc * job.nodes)
        settings = self.settings(overrides)
        run_dir = new_run_dir(self.name, settings)
        command = [job.config, *command_flags(settings, str(run_dir))]
        write_command(run_dir, command)
        return JobSpec(name=job.name, command=command, launcher="torchrun", nodes=job.nodes, procs_per_node=job.nproc,
                       run_dir=str(run_dir), env={"OMP_NUM_THREADS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
                       partition=job.partition)

    def parse_log_line(self, line: str, ctx: ParseContext | None = None) -> StepRecord | None:
        """Megatron's per-iteration line; tokens/s from `tokens/sec/gpu` or global batch x seq_len / time / world."""
        match = _ITERATION.search(line)
        found = {key: number(rx.search(line)) for key, rx in _FIELDS.items()}
        if not match or found["ms"] is None:
            return None
        step_time_s = found["ms"] / 1e3
        tokens_per_s = found["tps"]
        if tokens_per_s is None and found["gbs"] and ctx is not None and ctx.seq_len:
            tokens_per_s = found["gbs"] * ctx.seq_len / step_time_s / ctx.world_size
        record = StepRecord(step=int(match["step"]), loss=found["loss"], step_time_s=step_time_s,
                            tokens_per_s=tokens_per_s, tflops=found["tflops"])
        return mfu(record, ctx)

    def describe_layout(self, overrides: list[str], world_size: int) -> str:
        flags = self.settings(overrides)["megatron"]
        tp, pp, cp = (int(flags[k]) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                              "context_parallel_size"))
        extras = [name for name in ("sequence_parallel", "use_distributed_optimizer") if flags[name]]
        return " ".join([f"world={world_size} megatron tp={tp} pp={pp} cp={cp} dp={world_size // (tp * pp * cp)}",
                         *extras])
