"""One validated parallel layout, checked before any process group exists.

`validate_layout` is a pure function (Megatron's `validate_args`, torchtitan's `ParallelDims`):
tools call it for dry-runs, the launcher calls it before spawning ranks, and every rejection
names the numbers and the fix. `plan_dry_run` turns a valid layout into a per-rank plan with
memory estimates whose formulas are stated in the plan itself.
"""
from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, Field

from trainops.trainer.config import JobConfig, ParallelConfig, TrainingConfig
from trainops.trainer.model_args import ModelArgs, count_parameters

SCHEDULES: tuple[str, ...] = ("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
MULTI_STAGE_SCHEDULES = ("Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble")
MESH_DIM_NAMES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


class LayoutError(ValueError):
    """An impossible layout: the message names the numbers and the fix."""
class Layout(BaseModel):
    """A layout that passed every check; the mesh is `MESH_DIM_NAMES` in this order."""
    world_size: int
    dp_replicate: int
    dp_shard: int = Field(description="FSDP degree, inferred when the config says -1")
    cp: int
    tp: int
    pp: int
    virtual_stages: int = Field(description="pipeline stages per pp rank (1 unless interleaved)")
    pp_schedule: str
    sequence_parallel: bool
    micro_batch: int
    global_batch: int
    grad_accumulation: int = Field(description="micro-batches per step per data-parallel rank; the pipeline's "
                                               "n_microbatches when pp > 1")
    seq_len: int

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)

    @property
    def num_stages(self) -> int:
        return self.pp * self.virtual_stages

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of `rank` (row-major over `MESH_DIM_NAMES`, as `init_device_mesh` lays them out)."""
        out: dict[str, int] = {}
        rest = rank
        for name, size in reversed(list(zip(MESH_DIM_NAMES, self.mesh_shape, strict=True))):
            out[name] = rest % size
            rest //= size
        return {name: out[name] for name in MESH_DIM_NAMES}

    def stages_of(self, pp_rank: int) -> list[int]:
        """Global stage indices held by pipeline rank `pp_rank` (loop order; V order for ZBV)."""
        if self.pp_schedule == "ZBVZeroBubble":
            return [pp_rank, 2 * self.pp - 1 - pp_rank]
        return [pp_rank + v * self.pp for v in range(self.virtual_stages)]


def detect_backend() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def validate_layout(cfg: JobConfig, world_size: int, gpus_per_node: int | None = None, backend: str | None = None,
                    plan_only: bool = False) -> Layout:
    """Check `cfg` for `world_size` ranks; return the resolved layout or raise `LayoutError`.
    One check per concern, each naming the numbers and the fix (Megatron's validate_args style).
    `gpus_per_node` is the job's own node (a rank passes its LOCAL_WORLD_SIZE; a planner the declared
    topology), never the calling host's device count; None skips the domain check.
    `plan_only` accepts what can be planned but not yet trained here (context parallel on NCCL)."""
    par, train, args = cfg.parallel, cfg.training, cfg.model_args()
    dp_shard = _check_degrees(par, world_size)
    _check_heads_and_vocab(args, par.tp)
    _check_tied_embeddings(args, par)
    _check_tp_domain(par.tp, gpus_per_node)
    _check_pipeline(args, par)
    accumulation = _check_batch(par, train, dp=par.dp_replicate * dp_shard)
    _check_sequence_parallel(par, train, backend)
    _check_context_parallel(par, train, backend, plan_only)
    return Layout(
        world_size=world_size, dp_replicate=par.dp_replicate, dp_shard=dp_shard, cp=par.cp, tp=par.tp, pp=par.pp,
        virtual_stages=par.virtual_stages, pp_schedule=par.pp_schedule, sequence_parallel=par.sequence_parallel,
        micro_batch=train.micro_batch, global_batch=train.global_batch, grad_accumulation=accumulation,
        seq_len=train.seq_len,
    )


def validate_job_layout(cfg: JobConfig, nproc: int, nodes: int = 1) -> Layout:
    """The layout as a job runs it, before it is submitted: `nodes` x `nproc` ranks, each tensor-parallel
    group inside one node's ranks. The backend checks are the launch's (the submit host may have other
    devices than the nodes); the error names the job's shape beside the numbers and the fix."""
    world = nodes * nproc
    try:
        return validate_layout(cfg, world, gpus_per_node=nproc)
    except LayoutError as exc:
        raise LayoutError(f"{exc} (the job runs {world} ranks: {nodes} node{'s' if nodes > 1 else ''} x {nproc} "
                          "processes per node)") from None


def _check_degrees(par: ParallelConfig, world_size: int) -> int:
    """The degrees multiply to the world size; returns dp_shard (-1 is inferred)."""
    dp_replicate, dp_shard, cp, tp, pp = par.dp_replicate, par.dp_shard, par.cp, par.tp, par.pp
    if world_size < 1:
        raise LayoutError(f"world size {world_size} must be >= 1: pass --nproc N with N >= 1")
    for name in ("dp_replicate", "cp", "tp", "pp", "virtual_stages"):
        if getattr(par, name) < 1:
            raise LayoutError(f"parallel.{name}={getattr(par, name)} must be >= 1: set parallel.{name}=1 to disable it")
    if dp_shard == 0 or dp_shard < -1:
        raise LayoutError(f"parallel.dp_shard={dp_shard} must be >= 1, or -1 to infer it from the world size")
    fixed = dp_replicate * cp * tp * pp
    if dp_shard == -1:
        if world_size % fixed:
            raise LayoutError(
                f"world size {world_size} is not divisible by dp_replicate*cp*tp*pp = "
                f"{dp_replicate}*{cp}*{tp}*{pp} = {fixed}: use a world size that is a multiple of {fixed}, "
                "or lower tp/pp/cp/dp_replicate"
            )
        dp_shard = world_size // fixed
    if dp_replicate * dp_shard * cp * tp * pp != world_size:
        raise LayoutError(
            f"dp_replicate*dp_shard*cp*tp*pp = {dp_replicate}*{dp_shard}*{cp}*{tp}*{pp} = "
            f"{dp_replicate * dp_shard * cp * tp * pp} does not equal world size {world_size}: "
            "make the product equal the number of processes, or set parallel.dp_shard=-1 to infer it"
        )
    return dp_shard


def _check_heads_and_vocab(args: ModelArgs, tp: int) -> None:
    """Tensor parallel splits whole heads, whole kv heads and the vocabulary."""
    n_heads, n_kv_heads = args.n_heads, args.n_kv_heads or args.n_heads
    if n_heads % tp:
        raise LayoutError(f"attention heads {n_heads} are not divisible by tp={tp}: "
                          f"pick tp from the divisors of {n_heads}")
    if n_kv_heads % tp:
        raise LayoutError(
            f"kv heads {n_kv_heads} are not divisible by tp={tp}: pick tp from the divisors of {n_kv_heads} "
            "(grouped-query attention splits whole kv heads across tp ranks)"
        )
    if tp > 1 and args.vocab_size % tp:
        raise LayoutError(f"vocab size {args.vocab_size} is not divisible by tp={tp}: "
                          f"pad the vocabulary to a multiple of {tp}")


def _check_tied_embeddings(args: ModelArgs, par: ParallelConfig) -> None:
    if args.tie_embeddings and (par.tp > 1 or par.pp > 1):
        raise LayoutError(
            f"model.tie_embeddings=true cannot run with tp={par.tp}, pp={par.pp}: the shared weight is split by rows "
            "in the embedding and by columns in the output head (tp), or lives on two stages (pp); "
            "set model.tie_embeddings=false, or tp=1 and pp=1"
        )


def _check_tp_domain(tp: int, gpus_per_node: int | None) -> None:
    """Tensor parallel all-reduces every layer: it stays inside one node's accelerator domain."""
    if gpus_per_node is not None and tp > 1 and (tp > gpus_per_node or gpus_per_node % tp):
        raise LayoutError(
            f"tp={tp} does not fit one node's accelerator domain of {gpus_per_node}: tensor parallel "
            f"all-reduces every layer and must stay on the intra-node fabric; use tp <= {gpus_per_node} "
            f"dividing {gpus_per_node}, and scale across nodes with pp or dp"
        )


def _check_pipeline(args: ModelArgs, par: ParallelConfig) -> None:
    """The schedule fits the stage count, and the layers divide into the stages."""
    pp, virtual_stages, schedule = par.pp, par.virtual_stages, par.pp_schedule
    if pp > 1:
        if schedule not in SCHEDULES:
            raise LayoutError(f"parallel.pp_schedule={schedule!r} is unknown: use one of {', '.join(SCHEDULES)}")
        if schedule in ("GPipe", "1F1B") and virtual_stages != 1:
            raise LayoutError(
                f"parallel.pp_schedule={schedule} runs one stage per rank but virtual_stages={virtual_stages}: "
                "set virtual_stages=1, or use Interleaved1F1B / InterleavedZeroBubble for virtual stages"
            )
        if schedule in ("Interleaved1F1B", "InterleavedZeroBubble") and virtual_stages < 2:
            raise LayoutError(f"parallel.pp_schedule={schedule} interleaves stages and needs virtual_stages >= 2 "
                              f"(got {virtual_stages}): set parallel.virtual_stages=2")
        if schedule == "ZBVZeroBubble" and virtual_stages != 2:
            raise LayoutError("parallel.pp_schedule=ZBVZeroBubble places exactly 2 stages per rank in a V "
                              f"(got virtual_stages={virtual_stages}): set parallel.virtual_stages=2")
    elif virtual_stages > 1:
        raise LayoutError(f"parallel.virtual_stages={virtual_stages} needs pp > 1 (pp=1): "
                          "set parallel.pp >= 2 or virtual_stages=1")
    num_stages = pp * virtual_stages
    if args.n_layers % num_stages:
        raise LayoutError(
            f"layers {args.n_layers} are not divisible by pp*virtual_stages = {pp}*{virtual_stages} = {num_stages}: "
            f"pick pp*virtual_stages from the divisors of {args.n_layers}"
        )


def _check_batch(par: ParallelConfig, train: TrainingConfig, dp: int) -> int:
    """global batch = dp x micro batch x accumulation, with enough micro-batches for the schedule;
    returns the accumulation (micro-batches per step)."""
    micro_batch, global_batch, pp, schedule = train.micro_batch, train.global_batch, par.pp, par.pp_schedule
    unit = dp * max(1, micro_batch)
    if micro_batch < 1 or global_batch % unit:
        raise LayoutError(
            f"training.global_batch={global_batch} is not divisible by dp*micro_batch = {dp}*{micro_batch} = "
            f"{dp * micro_batch}: global batch = dp x micro_batch x accumulation; use a multiple of {unit} "
            f"(--set training.global_batch={unit * -(-global_batch // unit)}) or fewer ranks"
        )
    accumulation = global_batch // (dp * micro_batch)
    if pp > 1 and dp > 1 and par.data_parallel == "ddp":
        raise LayoutError(
            f"parallel.data_parallel=ddp cannot run with pp={pp} and dp={dp}: DDP's reducer breaks on pipeline "
            "stages that run several micro-batches per step; set parallel.data_parallel=fsdp (FSDP2 composes with PP)"
        )
    if pp > 1 and schedule == "1F1B" and accumulation < pp:
        raise LayoutError(
            f"1F1B needs micro-batches >= stages, got {accumulation} micro-batches for pp={pp}: micro-batches = "
            f"global_batch/(dp*micro_batch) = {global_batch}/({dp}*{micro_batch}); raise training.global_batch to "
            f">= {pp * dp * micro_batch} or lower micro_batch"
        )
    if pp > 1 and schedule in MULTI_STAGE_SCHEDULES:
        rounds = max(1, accumulation // pp)
        if accumulation % rounds:
            raise LayoutError(
                f"{schedule} needs micro-batches ({accumulation}) to be at most pp={pp} or a multiple of the "
                f"rounds ({rounds}): use global_batch = k*pp*dp*micro_batch, "
                f"e.g. {pp * dp * micro_batch * max(1, rounds)}"
            )
    return accumulation


def _check_sequence_parallel(par: ParallelConfig, train: TrainingConfig, backend: str | None) -> None:
    """Sequence parallel and its comm overlap (async TP) need tp, compile and NCCL."""
    tp, seq_len = par.tp, train.seq_len
    if par.sequence_parallel and tp == 1:
        raise LayoutError("parallel.sequence_parallel=true needs tp > 1 (tp=1): "
                          "set parallel.tp >= 2 or sequence_parallel=false")
    if par.sequence_parallel and seq_len % tp:
        raise LayoutError(f"training.seq_len={seq_len} is not divisible by tp={tp} under sequence parallel: "
                          f"use a multiple of {tp}")
    if not par.comm_overlap:
        return
    if not par.sequence_parallel:
        raise LayoutError("parallel.comm_overlap=true needs sequence_parallel=true (it overlaps the SP "
                          "all-gather/reduce-scatter with the GEMMs): enable sequence parallel or turn overlap off")
    if train.compile is not True:
        raise LayoutError("parallel.comm_overlap=true needs training.compile=true: the overlap (async TP) is an "
                          "inductor pass over the compiled blocks; set training.compile=true or comm_overlap=false")
    if (backend or detect_backend()) != "nccl":
        raise LayoutError("parallel.comm_overlap=true needs NCCL on CUDA (symmetric-memory collectives); this run "
                          f"uses {backend or detect_backend()}: set parallel.comm_overlap=false")


def _check_context_parallel(par: ParallelConfig, train: TrainingConfig, backend: str | None,
                            plan_only: bool) -> None:
    cp, seq_len = par.cp, train.seq_len
    if cp == 1:
        return
    backend = backend or detect_backend()
    if backend != "nccl":
        raise LayoutError(
            f"context parallel (cp={cp}) needs NCCL on CUDA (ring attention over the SDPA flash/efficient kernels); "
            f"this run uses the {backend} backend on CPU, which PyTorch's context parallel does not support: "
            "set parallel.cp=1"
        )
    if seq_len % (2 * cp):
        raise LayoutError(f"training.seq_len={seq_len} is not divisible by 2*cp = {2 * cp} "
                          f"(load-balanced context parallel): use a multiple of {2 * cp}")
    if not plan_only:
        raise LayoutError(
            f"context parallel (cp={cp}) is planned but not yet run by trainops.trainer.train (its sequence sharding "
            "and cp-wide gradient reduction need a multi-GPU host to prove): set parallel.cp=1 to train; "
            "--dry-run plans it"
        )


class RankPlan(BaseModel):
    """What one rank holds and roughly how much memory it needs (bytes)."""
    rank: int
    coords: dict[str, int] = Field(description="mesh coordinates by dimension name")
    stages: list[int] = Field(description="global pipeline stage indices on this rank")
    layers: list[int] = Field(description="transformer layer indices on this rank")
    holds_embedding: bool
    holds_output: bool
    params: int = Field(description="parameters held by this rank after tp and FSDP sharding")
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    total_bytes: int


class DryRunPlan(BaseModel):
    """A validated layout, planned per rank, without launching anything."""
    layout: Layout
    mesh_dim_names: list[str]
    mesh_shape: list[int]
    n_microbatches: int
    ranks: list[RankPlan]
    max_total_bytes: int
    formulas: dict[str, str] = Field(description="how each estimate is computed; estimates, not measurements")


FORMULAS = {
    "params": "stage params (embedding on stage 0, norm+output on the last) / tp for the sharded "
              "matrices (norms replicated) / dp_shard (FSDP2 shards every parameter)",
    "param_bytes": "params x 4 (fp32 master weights; bf16 compute copies are transient per layer)",
    "grad_bytes": "params x 4 (fp32 gradients, reduce-scattered to the shard)",
    "optimizer_bytes": "params x 8 (AdamW exp_avg and exp_avg_sq in fp32)",
    "activation_bytes": "in_flight_microbatches x per-layer bytes summed over the rank's layers; per layer "
                        "s*b*h*k*w / (tp*cp) with k=34 (Korthikanti et al. 2022: 34*s*b*h bytes per layer "
                        "at 16-bit without the s^2 attention scores, which SDPA does not keep; an upper "
                        "estimate, this model has no dropout masks), k=2 for a checkpointed block (its input "
                        "only) plus one block at k=34 being recomputed; full AC checkpoints every block, "
                        "selective every other one (as trainops.trainer.parallelize does); w=1 in bf16, 2 in fp32; "
                        "without sequence parallel the norm part (10 of 34) is not divided by tp; in-flight "
                        "micro-batches: 1 without pp, n_microbatches under GPipe, pp - pp_rank under the "
                        "1F1B-family schedules",
}


def _in_flight(layout: Layout, pp_rank: int) -> int:
    if layout.pp == 1:
        return 1
    if layout.pp_schedule == "GPipe":
        return layout.grad_accumulation
    return min(layout.grad_accumulation, layout.pp - pp_rank)


def _activation_bytes(args: Any, layout: Layout, n_layers: int, in_flight: int, precision: str, ac_mode: str) -> int:
    width = 1 if "bf16" in precision or "fp16" in precision else 2  # k counts bytes at 16-bit
    sbh = layout.seq_len * layout.micro_batch * args.dim * width // layout.cp
    tp = layout.tp

    def per_layer(k: float) -> float:
        if layout.sequence_parallel:
            return sbh * k / tp
        return sbh * (10 * k / 34 + (24 * k / 34) / tp)

    checkpointed = {"none": 0, "selective": (n_layers + 1) // 2, "full": n_layers}[ac_mode]
    stored = (checkpointed * sbh * 2 / (tp if layout.sequence_parallel else 1)
              + (n_layers - checkpointed) * per_layer(34))
    recompute = per_layer(34) if checkpointed else 0.0  # one block's activations, rebuilt in backward
    return int(stored * in_flight + recompute)


def plan_dry_run(cfg: JobConfig, nproc: int, gpus_per_node: int | None = None,
                 backend: str | None = None) -> DryRunPlan:
    """Validate `cfg` for `nproc` ranks and describe every rank: coordinates, stages, layers, memory."""
    layout = validate_layout(cfg, nproc, gpus_per_node=gpus_per_node, backend=backend, plan_only=True)
    args = cfg.model_args()
    counts = count_parameters(args)
    per_layer_sharded = (counts["per_layer"] - 2 * args.dim) / layout.tp + 2 * args.dim
    layers_per_stage = args.n_layers // layout.num_stages
    train = cfg.training
    precision, ac_mode = train.precision, train.activation_checkpointing
    last_stage = layout.num_stages - 1
    ranks = []
    for rank in range(nproc):
        coords = layout.coords(rank)
        stages = layout.stages_of(coords["pp"]) if layout.pp > 1 else [0]
        layers = [i for s in stages for i in range(s * layers_per_stage, (s + 1) * layers_per_stage)]
        has_embedding, has_output = 0 in stages, last_stage in stages
        params = len(layers) * per_layer_sharded
        if has_embedding:
            params += counts["embedding"] / layout.tp
        if has_output:
            params += args.dim + (0 if args.tie_embeddings and has_embedding
                                  else args.vocab_size * args.dim / layout.tp)
        params = math.ceil(params / layout.dp_shard)
        act = _activation_bytes(args, layout, len(layers), _in_flight(layout, coords["pp"]), precision, ac_mode)
        ranks.append(RankPlan(
            rank=rank, coords=coords, stages=stages, layers=layers, holds_embedding=has_embedding,
            holds_output=has_output, params=params, param_bytes=4 * params, grad_bytes=4 * params,
            optimizer_bytes=8 * params, activation_bytes=act, total_bytes=16 * params + act,
        ))
    return DryRunPlan(
        layout=layout, mesh_dim_names=list(MESH_DIM_NAMES), mesh_shape=list(layout.mesh_shape),
        n_microbatches=layout.grad_accumulation, ranks=ranks,
        max_total_bytes=max(r.total_bytes for r in ranks), formulas=FORMULAS,
    )
