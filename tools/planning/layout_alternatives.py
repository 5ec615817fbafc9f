"""What a layout's tensor and pipeline parallelism cost on the declared topology, and the layouts to
use instead when they do not fit (K-FM-1, K-STEP-5).

Tensor parallel all-reduces activations in every layer: across a scale-up domain it runs at the
slower link's speed. When it crosses, each smaller tp that divides the domain is tried with the
factor it gives up moved to pipeline parallel or to data parallel, through the trainer's own dry
run (so an alternative that does not fit the model or the batch says why), and each gets its cost:
tensor-parallel bytes and seconds on its link, the pipeline bubble, or the extra gradient bytes that
data parallel sends between nodes. Estimates from the model's shape, not measurements.
"""
from __future__ import annotations

from pydantic import BaseModel, Field

from trainops.trainer.config import JobConfig
from trainops.trainer.layout import plan_dry_run
from trainops.trainer.model_args import count_parameters

TP_FORMULA = ("bytes per rank per step = 4 all-reduces per layer (2 forward, 2 backward) x layers on the rank x "
              "micro-batches x micro_batch x seq_len / cp x dim x bytes_per_element x 2(tp-1)/tp (ring)")
BUBBLE_FORMULA = "pipeline bubble = (pp - 1) / (micro-batches per step + pp - 1) of the step (1F1B)"
DP_FORMULA = ("gradient all-reduce bytes per rank per step = 2 x parameters / (tp x pp) x 4 (fp32) x (dp-1)/dp "
              "(ring)")
BUBBLE_WORTH = 0.25  # a bubble above a quarter of the step costs more than most cross-domain tp saves


class PipelineCost(BaseModel):
    pp: int
    micro_batches: int
    bubble_fraction: float = Field(description=BUBBLE_FORMULA)
    verdict: str


class LayoutOption(BaseModel):
    """One layout that keeps tensor parallel inside the scale-up domain."""
    tp: int
    pp: int
    dp: int
    moved_to: str = Field(description="where the tp factor went: pp or dp")
    fits: bool = Field(description="whether the trainer's dry run accepts it for this model and batch")
    why_not: str | None = None
    tp_bytes_per_step: int = Field(0, description=TP_FORMULA)
    tp_seconds: float | None = Field(None, description="at the declared scale-up bandwidth; None: not declared")
    bubble_fraction: float | None = None
    extra_dp_bytes_per_step: int = Field(0, description="what the larger dp adds to " + DP_FORMULA)
    extra_dp_seconds: float | None = Field(None, description="at the declared inter-node bandwidth (overlappable "
                                                             "with the backward pass)")
    summary: str


def tp_bytes(cfg: JobConfig, tp: int, layers: int, micro_batches: int) -> int:
    if tp <= 1:
        return 0
    args, train = cfg.model_args(), cfg.training
    element = 2 if train.precision in ("bf16", "fp16") else 4
    tokens = train.micro_batch * train.seq_len // max(cfg.parallel.cp, 1)
    return int(4 * layers * micro_batches * tokens * args.dim * element * 2 * (tp - 1) / tp)


def gradient_bytes(params: int, tp: int, pp: int, dp: int) -> int:
    return int(2 * params / (tp * pp) * 4 * (dp - 1) / dp) if dp > 1 else 0


def size(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def seconds_at(nbytes: int, gbit_s: float | None) -> float | None:
    return None if gbit_s is None or nbytes == 0 else round(nbytes * 8 / (gbit_s * 1e9), 4)


def bubble(pp: int, micro_batches: int) -> float:
    return round((pp - 1) / (micro_batches + pp - 1), 3) if pp > 1 else 0.0


def pipeline_cost(pp: int, micro_batches: int, nodes: int) -> PipelineCost | None:
    """K-STEP-5: whether pipeline parallel pays at this scale."""
    if pp <= 1:
        return None
    share = bubble(pp, micro_batches)
    verdict = (f"pp={pp} with {micro_batches} micro-batches per step idles {share:.0%} of the step "
               f"({BUBBLE_FORMULA})")
    if share > BUBBLE_WORTH:
        verdict += f": above {BUBBLE_WORTH:.0%}, raise the micro-batches per step to at least {4 * pp} or lower pp"
    if nodes == 1:
        verdict += "; on one node, pp only pays when the model does not fit with tp and FSDP sharding"
    return PipelineCost(pp=pp, micro_batches=micro_batches, bubble_fraction=share, verdict=verdict)


def _option(cfg: JobConfig, nproc: int, tp: int, moved_to: str, intra_gbit_s: float | None,
            inter_gbit_s: float | None, now_dp_bytes: int) -> LayoutOption:
    par = cfg.parallel
    factor = par.tp // tp
    update = {"tp": tp, "pp": par.pp * factor} if moved_to == "pp" else {"tp": tp, "dp_shard": -1}
    trial = cfg.model_copy(update={"parallel": par.model_copy(update=update)})
    try:
        plan = plan_dry_run(trial, nproc)
    except ValueError as exc:
        return LayoutOption(tp=tp, pp=update.get("pp", par.pp), dp=0, moved_to=moved_to, fits=False,
                            why_not=str(exc).splitlines()[0], summary=f"tp={tp}, {moved_to} x{factor}: does not fit")
    lay, micro = plan.layout, plan.n_microbatches
    layers = max(len(r.layers) for r in plan.ranks)
    nbytes = tp_bytes(trial, tp, layers, micro)
    option = LayoutOption(tp=tp, pp=lay.pp, dp=lay.dp, moved_to=moved_to, fits=True, tp_bytes_per_step=nbytes,
                          tp_seconds=seconds_at(nbytes, intra_gbit_s), summary="")
    if moved_to == "pp":
        option.bubble_fraction = bubble(lay.pp, micro)
        cost = f"pipeline bubble {option.bubble_fraction:.0%} of the step"
    else:
        params = count_parameters(trial.model_args())["total"]
        option.extra_dp_bytes_per_step = max(gradient_bytes(params, tp, lay.pp, lay.dp) - now_dp_bytes, 0)
        option.extra_dp_seconds = seconds_at(option.extra_dp_bytes_per_step, inter_gbit_s)
        cost = (f"+{size(option.extra_dp_bytes_per_step)} gradient all-reduce per rank per step between nodes"
                + (f" ({option.extra_dp_seconds} s, overlappable)" if option.extra_dp_seconds is not None else ""))
    seconds = f", {option.tp_seconds} s" if option.tp_seconds is not None else ""
    traffic = f"tp {size(nbytes)} per rank per step inside the domain{seconds}" if tp > 1 else "no tensor parallel"
    option.summary = f"tp={tp} pp={lay.pp} dp={lay.dp}: {traffic}; {cost}"
    return option


def alternatives(cfg: JobConfig, nproc: int, domain: int, intra_gbit_s: float | None,
                 inter_gbit_s: float | None) -> list[LayoutOption]:
    """For a tp that crosses a scale-up domain of `domain` ranks: every smaller tp dividing the domain
    and the current tp, its factor moved to pp or to dp, fitting ones first, least tp traffic first."""
    current, lay = cfg.parallel.tp, plan_dry_run(cfg, nproc).layout
    now = gradient_bytes(count_parameters(cfg.model_args())["total"], current, lay.pp, lay.dp)
    options = [_option(cfg, nproc, tp, moved_to, intra_gbit_s, inter_gbit_s, now)
               for tp in range(min(domain, current - 1), 0, -1) if domain % tp == 0 and current % tp == 0
               for moved_to in ("pp", "dp")]
    return sorted(options, key=lambda o: (not o.fits, -o.tp))
