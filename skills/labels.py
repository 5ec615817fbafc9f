"""The labels an MFU or scaling figure is read against (R-ENV-1), from the job that ran: the run's own
RUN/config.toml (the trainer's resolved config, or the settings a framework adapter wrote there), the
world it was launched with, and the environment declaration (framework, version, hardware); the config also
declares the model's structure (sequence length, dense or MoE with its experts and top-k, A-ENV-3). The CLI's
overrides are not labels: a config file can set precision or tp that no override mentions."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from trainops.run_folder import RunFiles
from trainops.settings import read_toml
from trainops.skills.evidence.model import JobLabels, PackEnvironment
from trainops.skills.request import JobRequest
from trainops.tools.base import ToolError
from trainops.tools.frameworks import get_adapter
from trainops.trainer.config import load_config
from trainops.trainer.layout import validate_layout
from trainops.trainer.model_args import PRESETS, count_parameters


@dataclass
class Shape:
    """What a job's config says about its model, precision, layout and batch."""
    model: str
    parameters: int | None
    precision: str
    layout: str
    global_batch: int | None
    dp: int | None = field(default=None)
    seq_len: int | None = field(default=None)
    architecture: str | None = field(default=None)
    experts: int | None = field(default=None)
    top_k: int | None = field(default=None)
    sources: dict[str, str] = field(default_factory=dict)


LABELLED = ("model", "parameters", "precision", "parallel_layout", "seq_len", "architecture")
"""The labels a run's config gives, each sourced to it unless its reader names another source."""
DENSE_ONLY = "dense: the job builds the embedded trainer's model (trainer/model.py), which has no experts"
MEGATRON_TOP_K = 2
"""Megatron-LM's default --moe-router-topk, what a job that sets --num-experts alone routes to."""


def run_config(run_dir: str) -> dict:
    """The config the run actually used (RUN/config.toml), or {} for a folder without one; a file
    that is not UTF-8 TOML is a SettingsError (a ValueError) naming it, never a traceback."""
    path = RunFiles(run_dir).config
    return read_toml(path) if path.exists() else {}


def _preset_parameters(name: str) -> int | None:
    return count_parameters(PRESETS[name])["total"] if name in PRESETS else None


def _trainer(config, world: int) -> Shape:
    """The embedded trainer's JobConfig: the preset (or init_from folder), the dims that override it,
    and the layout resolved for `world` ranks (dp_shard=-1 inferred), every degree named."""
    m, par = config.model, config.parallel
    dims = {k: v for k, v in m.model_dump(exclude={"preset", "init_from"}).items() if v is not None}
    model = (f"init_from {Path(m.init_from).name}" if m.init_from else m.preset) + (
        " with " + ", ".join(f"{k}={v}" for k, v in dims.items()) if dims else "")
    lay = validate_layout(config, world, plan_only=True)
    layout = " ".join([f"world={world}", par.data_parallel, f"dp_replicate={lay.dp_replicate}",
                       f"dp_shard={lay.dp_shard}", f"cp={lay.cp}", f"tp={lay.tp}", f"pp={lay.pp}",
                       *([f"pp_schedule={lay.pp_schedule}", f"virtual_stages={lay.virtual_stages}"]
                         if lay.pp > 1 else []),
                       *(["sequence_parallel"] if lay.sequence_parallel else [])])
    return Shape(model=model, parameters=count_parameters(config.model_args())["total"],
                 precision=config.training.precision, layout=layout, global_batch=config.training.global_batch,
                 dp=lay.dp, seq_len=config.training.seq_len, architecture="dense",
                 sources={"architecture": DENSE_ONLY})


def _megatron_experts(own: dict) -> tuple[int | None, int | None, dict[str, str]]:
    """Megatron's MoE declaration, its own flags: --num-experts (unset: a dense model) and
    --moe-router-topk (unset: Megatron's default); a value no MoE can have is refused with the fix."""
    if own.get("num_experts") is None:
        return None, None, {"architecture": "dense: megatron.num_experts (--num-experts) is not set"}
    try:
        experts = int(own["num_experts"])
        top_k = int(own.get("moe_router_topk", MEGATRON_TOP_K))
    except (TypeError, ValueError):
        raise ToolError("summarize_run", f"megatron.num_experts={own['num_experts']!r} and megatron.moe_router_topk="
                                         f"{own.get('moe_router_topk')!r} must be whole numbers: set them as "
                                         "megatron.num_experts=8 megatron.moe_router_topk=2") from None
    if experts < 2:
        raise ToolError("summarize_run", f"megatron.num_experts={experts}: a mixture of experts has 2 or more; omit "
                                         "it for a dense model, or set megatron.num_experts to 2 or more")
    if not 1 <= top_k <= experts:
        raise ToolError("summarize_run", f"megatron.moe_router_topk={top_k} "
                                         f"{'exceeds' if top_k > experts else 'is below 1 for'} megatron.num_experts="
                                         f"{experts}: set megatron.moe_router_topk to at least 1 and at most {experts}")
    declared = "megatron.num_experts (--num-experts) of the job's config"
    top = ("megatron.moe_router_topk (--moe-router-topk) of the job's config" if "moe_router_topk" in own
           else f"Megatron's default --moe-router-topk {MEGATRON_TOP_K} (megatron.moe_router_topk is not set)")
    return experts, top_k, {"architecture": declared, "experts": declared, "top_k": top}


def _as_overrides(settings: dict) -> list[str]:
    return [f"{section}.{key}={json.dumps(value)}" for section, values in settings.items()
            if isinstance(values, dict) for key, value in values.items()]


def _torchtitan_job(run_dir: Path, own: dict) -> Shape:
    """torchtitan's model and sequence length are in its own job TOML (command.json names the file), not in
    trainops' config, unless the job overrode training.seq_len; dense or MoE is fixed by the flavor in
    torchtitan's model registry, which trainops does not read, so it is left unlabelled and says why."""
    shape = Shape(model="unknown", parameters=None, precision="", layout="", global_batch=None, sources={
        "architecture": "not in the run folder: torchtitan's model registry fixes dense or MoE by flavor, trainops "
                        "does not read it"})
    try:
        command = json.loads((run_dir / "command.json").read_text(encoding="utf-8"))
        toml = Path(command[command.index("--job.config_file") + 1])
        job = read_toml(toml)
    except (OSError, ValueError, IndexError):
        job, toml = {}, None
        shape.sources["model"] = f"{run_dir}/command.json names no readable --job.config_file"
    model = job.get("model", {})
    if toml is not None:
        shape.model = f"{model.get('name', 'unknown')} {model.get('flavor', '')}".strip()
        shape.sources["model"] = f"[model] name/flavor of {toml}"
    seq_len = own.get("training.seq_len", job.get("training", {}).get("seq_len"))
    if "training.seq_len" not in own:
        shape.sources["seq_len"] = (f"[training] seq_len of {toml}" if seq_len is not None else
                                    "not in the run folder: the job TOML leaves it to torchtitan's default")
    shape.seq_len = seq_len if isinstance(seq_len, int) and seq_len > 0 else None
    return shape


def _adapter(framework: str, settings: dict, world: int, run_dir: Path) -> Shape:
    """A framework adapter's settings (defaults with the job's overrides, as it wrote them to config.toml)."""
    adapter, training = get_adapter(framework), settings.get("training", {})
    own = settings.get(framework, {})
    if framework == "torchtitan":
        degrees = [int(own[f"parallelism.{k}_degree"]) for k in ("data_parallel_replicate", "tensor_parallel",
                                                                   "pipeline_parallel", "context_parallel")]
        shard = int(own["parallelism.data_parallel_shard_degree"])
        shard = world // (degrees[0] * degrees[1] * degrees[2] * degrees[3]) if shard == -1 else shard
        layout = adapter.describe_layout(
            [*_as_overrides(settings), f"torchtitan.parallelism.data_parallel_shard_degree={shard}"], world)
        job = _torchtitan_job(run_dir, own)
        dp = degrees[0] * shard
        precision = {"bfloat16": "bf16", "float32": "fp32"}.get(str(own["training.mixed_precision_param"]),
                                                                 str(own["training.mixed_precision_param"]))
        job.sources["parameters"] = ("not in the run folder: torchtitan logs its parameter count at start, trainops "
                                     "does not read it")
        job.precision, job.layout, job.global_batch, job.dp = (precision, layout,
                                                               int(own["training.local_batch_size"]) * dp, dp)
        return job
    layout = adapter.describe_layout(_as_overrides(settings), world)
    preset = str(settings.get("model", {}).get("preset", "unknown"))
    if framework == "deepspeed":
        dp, precision = world, ("bf16" if own.get("bf16.enabled") else "fp16" if own.get("fp16.enabled") else "fp32")
        layout += f" dp={world} tp=1 pp=1"
        experts, top_k, sources = None, None, {"architecture": DENSE_ONLY}
    else:  # megatron: dp is what tp x pp x cp leave
        split = int(own["tensor_model_parallel_size"]) * int(own["pipeline_model_parallel_size"]) * int(
            own["context_parallel_size"])
        dp, precision = world // split, ("bf16" if own.get("bf16") else "fp16" if own.get("fp16") else "fp32")
        experts, top_k, sources = _megatron_experts(own)
    return Shape(model=preset, parameters=_preset_parameters(preset), precision=precision, layout=layout,
                 global_batch=training.get("global_batch"), dp=dp, seq_len=training.get("seq_len"),
                 architecture="moe" if experts else "dense", experts=experts, top_k=top_k, sources=sources)


def shape_of_request(req: JobRequest, world: int) -> Shape:
    """The job a request would launch, read the way a run's config is (before any run exists)."""
    if req.framework == "trainops":
        return _trainer(req.trainer_config(), world)

    preset = [f"model.preset={req.preset}"] if req.preset and req.framework != "torchtitan" else []
    return _adapter(req.framework, get_adapter(req.framework).settings([*preset, *req.overrides]), world,
                    Path(req.config or "."))


def shape_of_run(run_dir: str, req: JobRequest, world: int) -> Shape:
    """The run's RUN/config.toml read as its framework wrote it; a folder without one falls back to the
    request, and every label then says so."""
    config = run_config(run_dir)
    if not config:
        shape = shape_of_request(req, world)
        where = f"the request (no RUN/config.toml in {run_dir})"
        shape.sources = {k: where for k in LABELLED}
        return shape
    ran = str(config.get("framework", "trainops"))
    if ran != req.framework:
        raise ToolError("summarize_run", f"{run_dir}/config.toml is a {ran} job, not {req.framework}: label a run with "
                                         f"its own framework (--framework {ran})")
    where = f"{RunFiles(run_dir).config}"
    if ran == "trainops":
        shape = _trainer(load_config(RunFiles(run_dir).config), world)
    else:
        shape = _adapter(ran, config, world, Path(run_dir))
    shape.sources = {**{k: where for k in LABELLED}, **shape.sources}
    return shape


def job_labels(run_dir: str, req: JobRequest, world: int, env: PackEnvironment) -> JobLabels:
    """Labels of one run: its config's shape at `world` ranks, the declared framework, version and
    hardware; a run of another framework than declared, or an undeclared version, is refused."""
    expected = get_adapter(req.framework).display_name
    if env.framework != expected:
        raise ToolError("declare_environment", f"the environment declares framework {env.framework!r} but the run is "
                                               f"a {req.framework} job ({expected}): declare it with `trainops env "
                                               f"--framework {req.framework}`")
    if env.framework_version in ("", "undeclared", "not installed"):
        raise ToolError("declare_environment", f"framework version of {env.framework} is {env.framework_version!r}: "
                                               "install it where the job runs, or declare its version")
    shape = shape_of_run(run_dir, req, world)
    declared = f"declare_environment ({env.scheduler})"
    return JobLabels(model=shape.model, parameters=shape.parameters, precision=shape.precision,
                     parallel_layout=shape.layout, world_size=world, global_batch=shape.global_batch,
                     framework=env.framework, framework_version=env.framework_version, hardware=env.hardware,
                     seq_len=shape.seq_len, architecture=shape.architecture, experts=shape.experts, top_k=shape.top_k,
                     sources={**shape.sources, "world_size": "the job as launched (nodes x processes per node)",
                              "framework": declared, "framework_version": declared, "hardware": declared})


def check_mfu(run_dir: str, mfu_pct: float | None, peak_source: str | None, labels: JobLabels) -> None:
    """An MFU above 100% measures a wrong peak, and a run with no peak has no MFU: refused, naming the device."""
    device = f"device {labels.hardware}"
    if peak_source and peak_source.startswith("missing-from-table"):
        raise ToolError("summarize_run", f"MFU refused for {run_dir}: {device} has no peak FLOP/s ({peak_source}); add "
                                         "its dense bf16 data-sheet peak to GPU_PEAK_TFLOPS_BF16 in "
                                         "trainops/trainer/metrics.py")
    if mfu_pct is not None and mfu_pct > 100.0:
        raise ToolError("summarize_run", f"MFU {mfu_pct:.1f}% of {run_dir} is above 100% on {device} against the peak "
                                         f"from {peak_source or 'an unlabelled source'}: that peak is wrong for this "
                                         "device; fix the peak (trainops/trainer/metrics.py GPU_PEAK_TFLOPS_BF16, or "
                                         "remove $TRAINOPS_HOME/cache/peak_flops.json to measure a CPU again)")


def label_runs(runs: list, req: JobRequest, env: PackEnvironment) -> JobLabels:
    """One set of labels for repeats of one job (baseline.RepeatResult: run_dir, world_size, summary),
    each repeat's MFU checked; repeats whose configs differ are not one job and are refused."""
    found = []
    for run in runs:
        job = job_labels(run.run_dir, req, run.world_size or run.summary.ranks, env)
        check_mfu(run.run_dir, run.summary.mfu_pct_median, run.summary.peak_source, job)
        found.append(job)
    differing = {j.model_dump_json(exclude={"sources"}) for j in found}
    if len(differing) > 1:
        raise ToolError("summarize_run", f"the repeats {[r.run_dir for r in runs]} ran different jobs "
                                         f"({'; '.join(j.parallel_layout for j in found)}): repeat one config")
    return found[0]
