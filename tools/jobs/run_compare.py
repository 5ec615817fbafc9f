"""`compare_runs`: what differs between two runs and what it cost: the settings their saved
configs disagree on (and the world size), beside both runs' step time, MFU and tokens/s.

It answers "why is run B slower than run A" the way SOP step S3 reasons: one setting changed is a
candidate cause; several changed at once confound each other, and only single-variable arms
(`trainops ablate`) can tell them apart; no setting changed points away from the config (the host,
a straggler, contention). Which run is slower comes from the metrics, never from the question.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from trainops.run_folder import RunFiles
from trainops.run_records import metrics_since
from trainops.tools.base import ToolError, tool
from trainops.tools.ids import RunRef
from trainops.tools.jobs.jobs import RunSummary, _confined_run, summarize_records
from trainops.tools.reliability.evidence import inert
from trainops.trainer.config import ConfigError, load_config

NOISE_PCT = 5.0
"""A step-time difference below this is not called slower or faster: one run of each is compared,
and single runs on a shared host spread by a few percent (the baseline's repeats measure it)."""


class CompareRunsInput(BaseModel):
    baseline: RunRef = Field(description="The run to compare against (run id or run folder), e.g. the faster one.")
    candidate: RunRef = Field(description="The other run (run id or run folder).")
    skip_steps: int = Field(2, ge=0, le=1_000_000, description="Warm-up steps left out of both summaries.")


class SettingChange(BaseModel):
    key: str = Field(description="The dotted config key (training.micro_batch), or world_size.")
    baseline: str
    candidate: str
    text: str = Field(description="'key: baseline -> candidate', as a citation can quote it.")


class CompareRunsOutput(BaseModel):
    baseline: RunSummary
    candidate: RunSummary
    changed: list[SettingChange] = Field(description="Every setting the two runs' configs disagree on.")
    step_time_ratio: float | None = Field(description="candidate / baseline median step time.")
    mfu_change_points: float | None = Field(description="candidate - baseline median MFU, percentage points.")
    slower: str | None = Field(description=f"The slower run's id, when step times differ by more than {NOISE_PCT:g}%; "
                                           "None within that.")
    finding: str = Field(description="What the difference and the settings support, in one sentence.")
    basis: str = Field(description="What the MFU figures stand on (A-ENV-5): each run's model, layout, precision, "
                                   "ranks and the peak its MFU is measured against, from its own config and metrics.")


def _flat(value: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(value, dict):
        return {k: v for key, sub in value.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): inert(str(value))}


LAYOUT_DIMS = ("dp_replicate", "dp_shard", "cp", "tp", "pp")
PEAK_NAMES = {"measured-gemm": "a measured CPU GEMM"}


def _basis(name: str, settings: dict[str, str], summary: RunSummary) -> str:
    """One run's basis: 'RUN: model tiny, fsdp with dp_replicate x ... = 1x2x1x1x1, fp32, 2 rank(s), MFU
    against ...'."""
    degrees = {d: settings.get(f"parallel.{d}", "?") for d in LAYOUT_DIMS}
    others = [int(v) for d, v in degrees.items() if d != "dp_shard" and v.lstrip("-").isdigit()]
    if degrees["dp_shard"] == "-1" and len(others) == 4 and summary.ranks:  # -1: the ranks the others leave
        degrees["dp_shard"] = str(max(1, summary.ranks // max(1, others[0] * others[1] * others[2] * others[3])))
    model = settings.get("model.preset")
    peak = PEAK_NAMES.get(summary.peak_source or "", summary.peak_source or "no recorded peak")
    return (f"{name}: model {model if model not in (None, 'None') else 'of custom dims'}, "
            f"{settings.get('parallel.data_parallel', '?')} with {' x '.join(LAYOUT_DIMS)} = "
            f"{'x'.join(degrees.values())}, {settings.get('training.precision', '?')}, {summary.ranks} rank(s), "
            f"MFU against {peak}")


def _settings(tool_name: str, run_dir) -> dict[str, str]:
    try:
        return _flat(load_config(RunFiles(run_dir).config).model_dump(mode="json"))
    except ConfigError as exc:
        raise ToolError(tool_name, f"{run_dir.name}: its saved config.toml does not load ({exc}); compare runs "
                                   "whose run folders trainops launched") from None


def _summary(tool_name: str, run: str, run_dir, skip_steps: int) -> RunSummary:
    records, _, not_read = metrics_since(run_dir)
    if not records:
        raise ToolError(tool_name, f"{run_dir / 'metrics.jsonl'} has no records yet; wait for the run to take a step")
    return summarize_records(run, records, skip_steps, not_read)


def _finding(changed: list[SettingChange], slower: str | None, ratio: float | None) -> str:
    if ratio is None:
        return "one of the runs has no step times after its warm-up: nothing to compare yet"
    if slower is None:
        return f"step times within {NOISE_PCT:g}% of each other: no slowdown to explain"
    head = f"run {slower} takes {max(ratio, 1.0 / ratio):.2f}x the other's step time"
    if not changed:
        return (f"{head} with the same settings: not the config; look at the host (contention, a straggler rank, "
                "data wait) and repeat both runs")
    if len(changed) == 1:
        return f"{head}, and one setting differs ({changed[0].text}): the candidate cause"
    keys = ", ".join(c.key for c in changed)
    return (f"{head}, and {len(changed)} settings differ ({keys}): they confound each other; ablate each alone "
            "against the baseline (SOP S3) to know which")


@tool("compare_runs", risk="read", tags=("metrics",))
def compare_runs(inp: CompareRunsInput) -> CompareRunsOutput:
    """Compare two runs: every setting their saved configs (and world sizes) disagree on, beside
    both runs' median step time, MFU and tokens/s, which one is slower (beyond a 5% noise band)
    and what that supports: one changed setting is a candidate cause, several confound each other."""
    dirs = {role: _confined_run("compare_runs", run) for role, run in (("baseline", inp.baseline),
                                                                       ("candidate", inp.candidate))}
    if dirs["baseline"] == dirs["candidate"]:
        raise ToolError("compare_runs", f"baseline and candidate are the same run ({dirs['baseline'].name}); give two "
                                        "runs")
    summaries = {role: _summary("compare_runs", run, dirs[role], inp.skip_steps)
                 for role, run in (("baseline", inp.baseline), ("candidate", inp.candidate))}
    base, cand = (_settings("compare_runs", dirs[role]) for role in ("baseline", "candidate"))
    base["world_size"], cand["world_size"] = str(summaries["baseline"].ranks), str(summaries["candidate"].ranks)
    changed = [SettingChange(key=key, baseline=base.get(key, "(unset)"), candidate=cand.get(key, "(unset)"),
                             text=f"{key}: {base.get(key, '(unset)')} -> {cand.get(key, '(unset)')}")
               for key in sorted(set(base) | set(cand)) if base.get(key) != cand.get(key)]
    b_step, c_step = summaries["baseline"].step_time_median_s, summaries["candidate"].step_time_median_s
    ratio = c_step / b_step if b_step and c_step else None
    slower = None
    if ratio is not None and abs(ratio - 1.0) * 100.0 > NOISE_PCT:
        slower = dirs["candidate"].name if ratio > 1.0 else dirs["baseline"].name
    b_mfu, c_mfu = summaries["baseline"].mfu_pct_median, summaries["candidate"].mfu_pct_median
    return CompareRunsOutput(baseline=summaries["baseline"], candidate=summaries["candidate"], changed=changed,
                             step_time_ratio=ratio, slower=slower,
                             mfu_change_points=c_mfu - b_mfu if b_mfu is not None and c_mfu is not None else None,
                             finding=_finding(changed, slower, ratio),
                             basis="; ".join(_basis(dirs[role].name, settings, summaries[role])
                                             for role, settings in (("baseline", base), ("candidate", cand))))

