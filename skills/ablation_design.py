"""S3: the ablation design, from the baseline's measured split rather than a fixed category order.

Each candidate arm acts on one figure of the baseline's step time, and Amdahl bounds what it can
save by that figure: an overlap knob hides at most the exposed communication, a data-pipeline knob
removes at most the wait for data, a kernel or batch knob shortens compute at most down to what
compute at peak would take (the MFU). Arms rank by that bound; an arm whose figure was not measured
ranks after the measured ones, and an arm that trades speed for memory goes last unless memory is
the problem. Ties keep the category order (communication overlap, kernels, data pipeline, batch)."""
from __future__ import annotations

from pydantic import BaseModel, Field

from trainops.skills.baseline import RepeatResult, exposed_comm_share
from trainops.skills.evidence.design import DesignedArm, DesignFigure
from trainops.skills.evidence.model import BaselineSummary
from trainops.skills.knobs import CATEGORY_ORDER, Knob, parse_arm
from trainops.skills.stats import spread
from trainops.tools.calls import invoke
from trainops.tools.context import CallContext, skill_context
from trainops.tools.jobs import jobs


class MeasuredSplit(BaseModel):
    """The baseline's step-time figures the design reads, each None where it was not measured."""

    exposed_comm_pct: float | None = Field(ge=0, le=100, description="collectives no compute hid, % of step time")
    data_wait_pct: float | None = Field(ge=0, le=100, description="the step's wait for its batch, % of step time")
    mfu_pct: float | None = Field(ge=0, description="baseline MFU, median over the repeats")
    source: str = Field(description="the baseline runs the figures are from")


def split_of(summary: BaselineSummary) -> MeasuredSplit:
    """S2's summary as the design reads it."""
    return MeasuredSplit(exposed_comm_pct=summary.exposed_comm_share_pct, data_wait_pct=summary.data_wait_share_pct,
                         mfu_pct=summary.mfu_pct.median, source=", ".join(summary.run_dirs))


def split_of_runs(run_dirs: list[str], ctx: CallContext | None = None) -> MeasuredSplit:
    """A recorded baseline's split, read from its run folders (summarize_run, and the traces a
    profiled run left) without launching anything."""
    ctx = skill_context("ablation", ctx)
    results = [RepeatResult(job_id="", run_dir=run_dir, summary=invoke(jobs.summarize_run, jobs.SummarizeRunInput(
        run=run_dir), ctx), started=0.0, ended=0.0) for run_dir in run_dirs]
    waits = [r.summary.data_wait_share_pct for r in results if r.summary.data_wait_share_pct is not None]
    mfus = [r.summary.mfu_pct_median for r in results if r.summary.mfu_pct_median is not None]
    return MeasuredSplit(exposed_comm_pct=exposed_comm_share(results),
                         data_wait_pct=sum(waits) / len(waits) if waits else None,
                         mfu_pct=spread(mfus).median if mfus else None, source=", ".join(run_dirs))


def _figure(name: str, value: float | None, method: str) -> DesignFigure:
    text = f"{name}: not measured" if value is None else f"{name} {value:.1f}% of step time"
    return DesignFigure(name=name, value_pct=value, text=text, method=method)


def _figures(split: MeasuredSplit) -> dict[str, DesignFigure]:
    """The figure each category acts on. Compute is the step less data wait and exposed
    communication; where communication was not measured it stays inside compute, which only
    loosens the bound."""
    exposed, data = split.exposed_comm_pct, split.data_wait_pct
    compute = max(0.0, 100.0 - (data or 0.0) - (exposed or 0.0))
    within = "" if exposed is not None else "; it includes communication, which was not measured"
    comm = _figure("exposed communication", exposed,
                   "torch.profiler traces of the baseline: collectives while no compute ran" if exposed is not None
                   else "no baseline run left a torch.profiler trace")
    kernels = _figure("compute", compute, f"step time less data wait and exposed communication{within}")
    return {
        "communication-overlap": comm,
        "kernels": kernels,
        "data-pipeline": _figure("data loading", data, "data_wait_s over step time in metrics.jsonl" if data is not None
                                 else "no baseline run reported data_wait_s"),
        "batch": kernels,
        "parallelism": _figure("pipeline bubble and layout balance", None,
                               "the baseline's split has no pipeline-bubble or per-layout figure"),
        "memory": _figure("peak memory against the device's", None, "the baseline's split has no memory figure"),
    }


def _bound(category: str, figure: DesignFigure, mfu: float | None) -> float | None:
    """Amdahl: the most step time an arm of `category` could save. Compute cannot go below what it
    would take at peak, which is the MFU's share of the step."""
    if figure.value_pct is None or category == "memory":
        return None
    if category in ("kernels", "batch"):
        return max(0.0, figure.value_pct - (mfu or 0.0))
    return figure.value_pct


def _reason(knob: Knob, figure: DesignFigure, bound: float | None, mfu: float | None, memory_bound: bool) -> str:
    if knob.category == "memory":
        return ("trades speed for memory: ranks first because memory is the problem" if memory_bound else
                "trades speed for memory: it saves no step time and may cost some; last, since memory is not what "
                "limits this baseline")
    if bound is None:
        return f"acts on {figure.name}, which was not measured ({figure.method}): ranks after the measured arms"
    if knob.category == "communication-overlap":
        return f"only exposed communication can be hidden: {figure.text}, so it saves at most {bound:.1f}%"
    if knob.category == "data-pipeline":
        return f"the step waits for data {figure.value_pct:.1f}% of its time: a faster pipeline saves at most that"
    peak = "" if mfu is None else f" at {mfu:.1f}% MFU (compute at peak would take {mfu:.1f}%)"
    return f"makes compute faster, it cannot remove it: {figure.text}{peak}, so it saves at most {bound:.1f}%"


def _tier(arm: DesignedArm, memory_bound: bool) -> int:
    """Memory arms first when memory is the problem, else last; measured figures before unmeasured."""
    if arm.category == "memory":
        return 0 if memory_bound else 3
    return 1 if arm.bound_pct is not None else 2


def design(split: MeasuredSplit, specs: list[str], framework: str = "trainops",
           memory_bound: bool = False) -> list[DesignedArm]:
    """The candidate arms (NAME=VALUE) ranked by expected gain, highest first, each with its figure,
    bound and reason. A bad arm is refused as parse_arm refuses it."""
    figures = _figures(split)
    arms = []
    for spec in specs:
        knob, value = parse_arm([spec], framework)
        figure = figures[knob.category]
        bound = _bound(knob.category, figure, split.mfu_pct)
        arms.append(DesignedArm(rank=1, arm=spec, knob=knob.name, value=value, category=knob.category, figure=figure,
                                bound_pct=bound, reason=_reason(knob, figure, bound, split.mfu_pct, memory_bound)))
    ranked = sorted(enumerate(arms), key=lambda pair: (_tier(pair[1], memory_bound), -(pair[1].bound_pct or 0.0),
                                                       CATEGORY_ORDER.index(pair[1].category), pair[0]))
    return [arm.model_copy(update={"rank": rank}) for rank, (_, arm) in enumerate(ranked, start=1)]


def ranked_specs(summary: BaselineSummary, specs: list[str], framework: str = "trainops") -> list[str]:
    """The arms in the design's order, for a plan that has S2's summary at hand."""
    return [arm.arm for arm in design(split_of(summary), specs, framework)]
