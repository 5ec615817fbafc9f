"""The job configuration: one TOML file, eight sections, `section.key=value` overrides.

Every field is documented and typed; modes are `Literal`s. Any mistake (an unknown section
or key, a value of the wrong type or outside the allowed set) becomes a `ConfigError` that
names `section.key`, the value seen and what is allowed, before a process is started.

A command loads its config once (`load_config`) and passes the typed `JobConfig` on; a variant
of it (an ablation arm, a drill's settings) is `with_overrides`, validated without reading the
file again, and travels in a request as a `LoadedConfig`.
"""
from __future__ import annotations

import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from trainops.run_folder import read_regular
from trainops.trainer.model_args import PRESETS, ModelArgs

PipelineSchedule = Literal["GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble"]


class ConfigError(ValueError):
    """A configuration mistake, phrased for the person who made it."""
class _Section(BaseModel):
    """Every float of a job config must be finite: an lr of inf or nan passes `gt=0` and trains garbage."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class ModelConfig(_Section):
    preset: str = Field("tiny", description=f"named model shape, one of {sorted(PRESETS)}; "
                        "the fields below override it when set")
    dim: int | None = Field(None, gt=0, description="hidden size")
    n_layers: int | None = Field(None, gt=0, description="number of transformer blocks")
    n_heads: int | None = Field(None, gt=0, description="query heads per block")
    n_kv_heads: int | None = Field(None, gt=0, description="key/value heads (grouped-query attention)")
    vocab_size: int | None = Field(None, gt=0, description="vocabulary size (256 for the byte tokenizer)")
    ffn_hidden_dim: int | None = Field(None, gt=0, description="SwiGLU hidden size")
    norm_eps: float | None = Field(None, gt=0, description="RMSNorm epsilon")
    rope_theta: float | None = Field(None, gt=0, description="RoPE base frequency")
    tie_embeddings: bool | None = Field(None, description="share the input embedding and output weights")
    init_from: str | None = Field(None, description="Hugging Face Llama folder (config.json + safetensors) "
                                  "whose weights start the run; its config.json gives the shape, so the "
                                  "preset is ignored and a dim set here must agree with it")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in PRESETS:
            raise ValueError(f"unknown preset {value!r}; use one of {sorted(PRESETS)}")
        return value


class ParallelConfig(_Section):
    dp_replicate: int = Field(1, ge=1, description="data-parallel replicas (DDP, or HSDP's outer dim)")
    dp_shard: int = Field(-1, ge=-1, description="FSDP shard degree; -1 infers world / (other degrees)")
    cp: int = Field(1, ge=1, description="context-parallel degree")
    tp: int = Field(1, ge=1, description="tensor-parallel degree")
    pp: int = Field(1, ge=1, description="pipeline-parallel stages")
    pp_schedule: PipelineSchedule = Field("1F1B", description="pipeline schedule")
    virtual_stages: int = Field(1, ge=1, description="model chunks per pipeline rank (interleaved schedules)")
    sequence_parallel: bool = Field(False, description="shard norms/dropouts along the sequence with TP")
    comm_overlap: bool = Field(False, description="overlap TP collectives with the GEMMs (async TP); "
                               "needs sequence_parallel")
    data_parallel: Literal["ddp", "fsdp"] = Field(
        "fsdp", description="ddp: every data-parallel rank holds a full replica; fsdp: FSDP2 fully_shard")
    reshard_after_forward: bool = Field(
        True, description="FSDP2: free gathered parameters after forward (ZeRO-3-like); false keeps "
        "them until backward (ZeRO-2-like)")
    fsdp_unit_params: int = Field(
        -1, ge=-1, description="FSDP2: shard consecutive blocks as one unit (one all-gather and one "
        "reduce-scatter per unit) until it holds this many parameters; 0 = one unit per block; -1 (auto) "
        "= one per block on GPUs, the whole model as one unit on the CPU (gloo shares the compute cores, so "
        "more collectives only add latency)")
    cpu_collectives: Literal["auto", "gloo", "shared_memory"] = Field(
        "auto", description="CPU runs: move data-parallel gradients and parameters between ranks through "
        "shared memory (one gloo barrier per collective) or through gloo's TCP; auto = shared memory when "
        "every data-parallel rank is on one host and /dev/shm holds the buffers, else gloo")

    @field_validator("dp_shard")
    @classmethod
    def _not_zero(cls, value: int) -> int:
        if value == 0:
            raise ValueError("0 is not a degree; use a positive degree or -1 to infer it")
        return value


AUTO_COMPILE_MIN_STEPS = 1000
"""`training.compile = "auto"` compiles runs at least this long: compiling takes seconds (CPU, small
models) to a minute, and the fused kernels save 4-15 % of a step, so short runs (the SOP's probes,
ablation arms, drills) stay eager and long ones gain."""
RESTORE_TIMEOUT_S = 600.0
"""resilience.restore_timeout_s's default: a group generation's join, model build, checkpoint load and
first step, bounded as torch bounds a NCCL collective by default (10 min) and torchelastic a rendezvous's
join; a rank hung there is found after it, one hung in training after collective_timeout_s."""


class TrainingConfig(_Section):
    steps: int = Field(20, ge=1, description="optimizer steps to run")
    global_batch: int = Field(8, ge=1, description="sequences per optimizer step, all ranks together")
    micro_batch: int = Field(4, ge=1, description="sequences per forward/backward on one rank")
    seq_len: int = Field(64, ge=2, description="tokens per sequence")
    lr: float = Field(3e-3, gt=0, description="peak learning rate (AdamW)")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine floor as a fraction of lr")
    warmup_steps: int = Field(2, ge=0, description="linear warm-up steps before the cosine decay")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping threshold (global L2 norm)")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="compute precision")
    activation_checkpointing: Literal["none", "selective", "full"] = Field(
        "none", description="recompute activations in backward: none, every other block, every block")
    compile: bool | Literal["auto"] = Field(
        "auto", description=f"torch.compile each transformer block: true, false, or auto: on for runs of "
        f"{AUTO_COMPILE_MIN_STEPS} steps or more, which pay back the compile time, where a compiler is at hand")
    seed: int = Field(0, ge=0, description="seed for weights, data and dropout-free RNG state")
    deterministic: bool = Field(True, description="torch.use_deterministic_algorithms (warn-only)")

    @field_validator("compile", mode="before")
    @classmethod
    def _true_false_or_auto(cls, value: Any) -> bool | str:
        if isinstance(value, bool):
            return value
        spelled = str(value).lower()
        if spelled not in ("true", "false", "auto"):
            raise ValueError("expected true, false or auto")
        return "auto" if spelled == "auto" else spelled == "true"

    @model_validator(mode="after")
    def _batch_divides(self) -> "TrainingConfig":
        if self.global_batch % self.micro_batch:
            raise ValueError(f"training.global_batch ({self.global_batch}) must be a multiple of "
                             f"training.micro_batch ({self.micro_batch})")
        return self


class DataConfig(_Section):
    kind: Literal["synthetic", "text"] = Field("text", description="synthetic random tokens, or "
                                               "a byte-level tokenizer over a text file")
    path: str | None = Field(None, description="text file for kind=text; default: the shipped "
                             "trainer/text/public_domain_excerpts.txt")


class CheckpointConfig(_Section):
    enable: bool = Field(False, description="save distributed checkpoints and resume from the newest")
    interval: int = Field(10, ge=1, description="save every N steps (and at the last step)")
    mode: Literal["sync", "async", "async_pinned"] = Field(
        "sync", description="sync: block until written; async: stage then write in background; "
        "async_pinned: async with pinned-memory staging")
    keep: int = Field(2, ge=1, description="keep the newest N committed checkpoints")
    folder: str = Field("checkpoints", description="folder under the run directory")
    load_readers: Literal["one_per_replica_group", "every_rank"] = Field(
        "one_per_replica_group", description="who reads a checkpoint from storage on resume: one rank of each "
        "data-parallel replica group, checking the sha256 of what it reads, then broadcasting to the group "
        "(storage reads do not grow with the replicas); every_rank: each rank reads its own part")


class MetricsConfig(_Section):
    log_every: int = Field(1, ge=1, description="print a readable line on rank 0 every N steps")
    jsonl: bool = Field(True, description="append one JSON record per step per rank to metrics.jsonl")
    prometheus_port_base: int = Field(0, ge=0, le=65000, description="exporter port of rank 0 (rank R "
                                      "uses base+R); 0 turns the exporters off")
    heartbeat: bool = Field(True, description="rewrite heartbeat/rank{R}.json every step")
    param_checksum: bool = Field(True, description="record a checksum of this rank's parameters each "
                                 "step, compared among replicas to detect silent data corruption")
    profile_steps: list[int] = Field(default_factory=list, description="steps to run under torch.profiler, "
                                     "exported as a Chrome trace per rank to profile/rank{R}.json: a list of "
                                     "consecutive steps, or \"start,count\"; empty (default) profiles nothing")

    @field_validator("profile_steps", mode="before")
    @classmethod
    def _steps_from_pair(cls, value: Any) -> Any:
        """`--set metrics.profile_steps=6,2` arrives as the string "6,2": start at step 6, 2 steps."""
        if isinstance(value, str):
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if len(parts) != 2 or not all(p.isdigit() for p in parts) or int(parts[0]) < 1:
                raise ValueError("give \"start,count\" (e.g. \"6,2\", start >= 1) or a list of consecutive steps")
            return list(range(int(parts[0]), int(parts[0]) + int(parts[1])))
        return value

    @field_validator("profile_steps")
    @classmethod
    def _consecutive(cls, value: list[int]) -> list[int]:
        if value and (value[0] < 1 or value != list(range(value[0], value[0] + len(value)))):
            raise ValueError("the profiled steps must be consecutive and >= 1; give \"start,count\" (e.g. \"6,2\")")
        return value


class FaultsConfig(_Section):
    crash_step: int | None = Field(None, ge=0, description="crash at the start of this step")
    crash_rank: int = Field(0, ge=0, description="rank that crashes")
    crash_mode: Literal["exit", "sigkill"] = Field("exit", description="exit with a code, or SIGKILL itself")
    hang_step: int | None = Field(None, ge=0, description="hang from this step on")
    hang_rank: int = Field(0, ge=0, description="rank that hangs")
    nan_step: int | None = Field(None, ge=0, description="make the loss NaN at this step")
    bitflip_step: int | None = Field(None, ge=0, description="flip a bit in one parameter at this step")
    bitflip_rank: int = Field(0, ge=0, description="rank whose parameter is flipped")
    slow_rank: int | None = Field(None, ge=0, description="straggler rank")
    slow_ms: int = Field(0, ge=0, description="extra milliseconds per step on the straggler rank")
    corrupt_checkpoint: bool = Field(False, description="corrupt the newest checkpoint after it is saved")


class ResilienceConfig(_Section):
    in_process_restart: bool | Literal["auto"] = Field(
        "auto", description="when a rank dies or hangs, keep the surviving processes, re-form the group with a "
        "warm spare in the dead rank's place and continue from the newest verified checkpoint, instead of "
        "failing the job (the scheduler's requeue); applies to 2 or more ranks on one host, and across nodes "
        "under Slurm, where each node runs its own supervisor. auto: on where a spare costs the ranks nothing "
        "(a GPU per rank on the host, a spare waiting on the CPU; or spare_nodes allocated), off on a CPU-only "
        "host, where a spare's start-up takes a core from the ranks")
    warm_spares: int = Field(1, ge=0, le=64, description="in-process restart: spare processes started with the "
                             "job (torch imported, nothing built) waiting to take a failed rank's place")
    spare_nodes: int = Field(
        0, ge=0, le=8, description="in-process restart under Slurm: whole nodes of warm spares allocated with the "
        "job (nodes of the hot-spare pool), each holding as many spares as a node holds ranks; a lost node's ranks "
        "move onto one instead of waiting for a requeue")
    collective_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="in-process restart: once every rank of a group generation has done "
        "its first step, a collective silent for this long counts as a hang; the rank is killed and replaced")
    restore_timeout_s: float = Field(
        RESTORE_TIMEOUT_S, gt=0, le=86400, description="in-process restart: how long the ranks of a new group "
        "generation may take to join it, build the model, load the checkpoint and do their first step, each "
        "waiting for the slowest (a spare admitted on a busy host, rank 0 verifying a large checkpoint, a cold "
        "compile); a slow restore is not a hang. Never shorter than collective_timeout_s")
    process_group_timeout_s: float | None = Field(
        None, gt=0, le=86400, description="without in-process restart: how long a rank waits in a collective "
        "for a peer before it fails with a timeout (the process group's timeout), so a hung rank ends the job "
        "instead of holding it; None: torch's default (30 min for gloo)")

    def in_process(self, ranks: int, gpus_here: int | None) -> tuple[bool, str]:
        """Whether a launch of `ranks` ranks runs under the supervisor, and why. `gpus_here`: the GPUs of
        the host that runs the job, None when the launching host is not that host (a batch script)."""
        if ranks < 2:
            return False, "one rank has no survivor to keep"
        if self.in_process_restart != "auto":
            return self.in_process_restart, f"resilience.in_process_restart={str(self.in_process_restart).lower()}"
        if self.spare_nodes:
            return True, f"auto: resilience.spare_nodes={self.spare_nodes} allocates spares for it"
        if gpus_here is not None and gpus_here >= ranks:
            return True, f"auto: a GPU per rank ({gpus_here} for {ranks}), and a warm spare waits on the CPU"
        where = "on this host" if gpus_here is not None else "known where the job is placed"
        return False, (f"auto: no GPU per rank {where}, so a warm spare's start-up would take a core from the "
                       "ranks; set resilience.in_process_restart=true to use it anyway")


class JobConfig(_Section):
    model: ModelConfig = Field(default_factory=ModelConfig, description="model shape")
    parallel: ParallelConfig = Field(default_factory=ParallelConfig, description="parallel layout")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="optimisation")
    data: DataConfig = Field(default_factory=DataConfig, description="input data")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="checkpoints")
    metrics: MetricsConfig = Field(default_factory=MetricsConfig, description="metrics outputs")
    faults: FaultsConfig = Field(default_factory=FaultsConfig, description="fault injection (drills)")
    resilience: ResilienceConfig = Field(default_factory=ResilienceConfig, description="recovery in place")

    def model_args(self) -> ModelArgs:
        """The preset (or the `init_from` checkpoint's shape) with explicit dims applied; RoPE
        tables cover the training seq_len."""
        dims = {k: v for k, v in self.model.model_dump(exclude={"preset", "init_from"}).items() if v is not None}
        if self.model.init_from is not None:
            args = _checkpoint_args(self.model.init_from)
            differing = {k: v for k, v in dims.items() if getattr(args, k) != v}
            if differing:
                raise ValueError(f"model.init_from={self.model.init_from!r} has "
                                 f"{ {k: getattr(args, k) for k in differing} }, but the config sets {differing}: "
                                 "remove these model fields (the checkpoint's config.json gives the shape)")
        else:
            args = replace(PRESETS[self.model.preset], **dims)
        return replace(args, max_seq_len=max(args.max_seq_len, self.training.seq_len))

    @model_validator(mode="after")
    def _consistent(self) -> "JobConfig":
        args = self.model_args()
        if args.dim % args.n_heads:
            raise ValueError(f"model.dim ({args.dim}) must be divisible by model.n_heads ({args.n_heads})")
        if args.n_heads % args.kv_heads:
            raise ValueError(f"model.n_heads ({args.n_heads}) must be divisible by "
                             f"model.n_kv_heads ({args.kv_heads})")
        if self.data.kind == "text" and args.vocab_size < 256:
            raise ValueError(f"data.kind='text' uses byte tokens: model.vocab_size ({args.vocab_size}) "
                             "must be at least 256")
        return self

    def to_toml(self) -> str:
        """TOML text that `load_config` reads back to an equal config (None fields are left out)."""
        lines: list[str] = []
        for section, values in self.model_dump().items():
            lines.append(f"[{section}]")
            lines += [f"{key} = {_toml_value(value)}" for key, value in values.items() if value is not None]
            lines.append("")
        return "\n".join(lines)


def _checkpoint_args(folder: str) -> ModelArgs:
    from trainops.trainer.hf import HFFormatError, read_hf_config

    try:
        return read_hf_config(folder)
    except HFFormatError as error:
        raise ValueError(f"model.init_from={folder!r}: {error}") from None


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


SECTIONS: dict[str, type[_Section]] = {
    name: field.annotation for name, field in JobConfig.model_fields.items()  # type: ignore[misc]
}


def _check_key(section: str, key: str | None, where: str) -> None:
    if section not in SECTIONS:
        raise ConfigError(f"{where}: unknown section {section!r}; sections are {sorted(SECTIONS)}")
    if key is not None and key not in SECTIONS[section].model_fields:
        raise ConfigError(f"{where}: unknown key {section}.{key}; keys of section {section!r} are "
                          f"{sorted(SECTIONS[section].model_fields)}")


def _parse_override(override: str) -> tuple[str, str, Any]:
    name, sep, raw = override.partition("=")
    section, dot, key = name.strip().partition(".")
    if not sep or not dot or not key:
        raise ConfigError(f"override {override!r} is not section.key=value (e.g. training.steps=50)")
    _check_key(section, key, f"override {override!r}")
    raw = raw.strip()
    # pydantic's lax mode turns "3" into 3 and "true" into True by the field's type
    return section, key, None if raw.lower() in ("none", "null", "") else raw


def _explain(error: ValidationError, data: dict[str, Any]) -> ConfigError:
    problems = []
    for item in error.errors():
        loc = ".".join(str(part) for part in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        if len(item["loc"]) == 2:
            seen = data.get(item["loc"][0], {}).get(item["loc"][1], item.get("input"))
            problems.append(f"{loc} = {seen!r} is not valid: {message}")
        else:  # a cross-field check: its message already names the fields
            problems.append(message)
    return ConfigError("; ".join(problems))


MAX_CONFIG_BYTES = 1 << 20


def load_config(path: str | Path | None = None, preset: str | None = None,
                overrides: list[str] | None = None) -> JobConfig:
    """Read TOML (optional), apply a model preset (optional), then `section.key=value` overrides."""
    data: dict[str, dict[str, Any]] = {}
    if path is not None:
        file = Path(path)
        raw = read_regular(file, MAX_CONFIG_BYTES)
        if raw is None:
            raise ConfigError(f"config file {str(file)!r} does not exist, is not a regular file or is over "
                              f"{MAX_CONFIG_BYTES} bytes; pass a TOML file or use --preset")
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as err:
            raise ConfigError(f"config file {str(file)!r} is not UTF-8 text (byte {err.start}); save it as "
                              "UTF-8") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"config file {str(file)!r} is not valid TOML: {err}") from None
        for section, values in data.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{file}: top-level key {section!r} must be a section table (a TOML header line)")
            _check_key(section, None, str(file))
            for key in values:
                _check_key(section, key, str(file))
    if preset is not None:
        data.setdefault("model", {})["preset"] = preset
    return _validated(data, overrides or [])


def with_overrides(config: JobConfig, overrides: list[str]) -> JobConfig:
    """`config` with `section.key=value` overrides applied, validated as `load_config` validates a
    file: a variant of a config loaded once, its file not read again (the same config as loading
    `config.to_toml()` with the overrides)."""
    if not overrides:
        return config
    return _validated(config.model_dump(exclude_none=True), overrides)


def _validated(data: dict[str, dict[str, Any]], overrides: list[str]) -> JobConfig:
    for override in overrides:
        section, key, value = _parse_override(override)
        data.setdefault(section, {})[key] = value
    try:
        return JobConfig.model_validate(data)
    except ValidationError as err:
        raise _explain(err, data) from None


def _loaded_only(value: Any) -> Any:
    if value is None or isinstance(value, JobConfig):
        return value
    raise ValueError("is the config trainops loaded itself, never a caller's data: give config, preset and overrides")


LoadedConfig = Annotated[SkipJsonSchema[JobConfig | None], BeforeValidator(_loaded_only)]
"""A request's field for the `JobConfig` its caller already loaded (the typed object only, hidden from
the JSON schema a model sees): the config of exactly that request's config, preset and overrides."""
