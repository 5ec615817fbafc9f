"""The adapter contract: what every adapter declares and returns, and the helpers they share.
An adapter is plain data plus pure functions: it imports its framework (if at all) only inside
methods, so the CLI and the tool catalogue stay light and an adapter works for planning and log
parsing where the framework is not installed. Choosing an adapter by name is the package's
`trainops.tools.frameworks.get_adapter`, above the adapters; this module imports none of them."""
from __future__ import annotations

import json
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal, Protocol, get_args, runtime_checkable

from pydantic import BaseModel, Field

from trainops.run_folder import RunFiles
from trainops.tools.schedulers.base import JobSpec, TrainingJob

# The frameworks trainops adapts, declared once: known_frameworks() and the adapters' `name` read it.
FrameworkName = Literal["trainops", "deepspeed", "torchtitan", "megatron"]
# Knob categories in ablation-plan order, highest expected gain first (MegaScale's breakdown).
KnobCategory = Literal["communication-overlap", "kernels", "data-pipeline", "batch", "memory", "parallelism"]
MfuSource = Literal["framework", "trainops-from-tflops", "trainops-flops-convention", "none"]


class FrameworkRefused(ValueError):
    """Input an adapter refuses before launch; the message names the flag, the value and the fix."""


class FrameworkKnob(BaseModel):
    """One ablation variable in the framework's own vocabulary."""

    name: str = Field(description="What the user types in --knob NAME=VALUE.")
    category: KnobCategory = Field(description="Orders the ablation plan (communication overlap first).")
    flag: str = Field(description="The framework's own flag or config key the knob sets, e.g. '--tp-comm-overlap' or "
                                  "'zero_optimization.stage'.")
    override: str = Field(description="The key the knob sets in the adapter's overrides (section.key=value).")
    values: tuple[str, ...] = Field(description="Accepted values.")
    expected_effect: str = Field(description="What we expect and why.")
    min_procs: int = Field(1, description="Processes the knob needs to mean anything.")


class SopPlan(BaseModel):
    """What `trainops sop --framework` runs where the operator names nothing, in the framework's
    own keys: the sections differ (DeepSpeed saves synchronously here, torchtitan nests its
    steps under its own section), so each adapter carries its own."""

    steps_key: str = Field("training.steps", description="The override that sets the number of steps.")
    job: tuple[str, ...] = Field((),
                                 description="Overrides for a small SOP job when no config is given "
                                             "(steps added by the SOP).")
    arms: tuple[str, ...] = Field(description="Default ablation arms NAME=VALUE, highest expected gain first; "
                                              "--quick runs the first.")
    drill: tuple[str, ...] = Field(description="Overrides that make the job checkpoint often enough to drill.")
    faults: tuple[str, ...] = Field(description="Default drills; --quick runs the first.")


class StepRecord(BaseModel):
    """A framework's step line in trainops' metric names (the metrics.jsonl record subset)."""

    step: int
    loss: float | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = Field(None, description="Per device (GPU/rank), as trainops records it.")
    tflops: float | None = Field(None, description="Achieved TFLOP/s per device.")
    mfu_pct: float | None = None
    mfu_source: MfuSource = Field("none", description="framework: the framework printed MFU; trainops-from-tflops: its "
                                  "TFLOP/s over trainops' peak; trainops-flops-convention: tokens/s x trainops' "
                                  "FLOPs/token over the peak.")


class ParseContext(BaseModel):
    """What trainops knows about a run that the framework's log line may not say."""

    flops_per_token: float | None = Field(None,
                                          description="trainops' FLOPs/token (trainops.trainer.metrics.flops_per_token "
                                                      "convention).")
    peak_tflops: float | None = Field(None, description="Per-device peak TFLOP/s (MFU denominator).")
    seq_len: int | None = None
    world_size: int = Field(1, ge=1, description="Devices the global batch is spread over.")


class FrameworkJob(TrainingJob):
    """A job in the adapter's vocabulary: the overrides are `section.key=value` pairs; the
    adapter documents its sections (knob overrides use the same keys)."""

    name: str = Field("train", description="Job name (lower-case letters, digits, '-').")
    preset: str | None = Field("tiny", description="trainops model preset when no config is given.")


@runtime_checkable
class FrameworkAdapter(Protocol):
    name: FrameworkName
    display_name: str
    package: str | None

    sop_plan: SopPlan

    def version(self) -> str: ...
    def knobs(self) -> list[FrameworkKnob]: ...
    def validate(self, knob_values: dict[str, str], overrides: list[str] | None = None,
                 world_size: int = 2) -> None: ...
    def build_job(self, job: FrameworkJob) -> JobSpec: ...
    def parse_log_line(self, line: str, ctx: ParseContext | None = None) -> StepRecord | None: ...
    def checkpoint_dir(self, run_dir: str) -> str: ...
    def describe_layout(self, overrides: list[str], world_size: int) -> str: ...


def installed_version(package: str | None) -> str:
    """The installed distribution's version, or 'not installed'."""
    if package is None:
        return "not installed"
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def knob_table(knobs: list[FrameworkKnob]) -> dict[str, FrameworkKnob]:
    return {k.name: k for k in knobs}


def check_knob_values(framework: str, knobs: list[FrameworkKnob], knob_values: dict[str, str]) -> None:
    """Refuse knobs the framework lacks and values it does not accept."""
    table = knob_table(knobs)
    for name, value in knob_values.items():
        if name not in table:
            raise FrameworkRefused(f"knob: {framework} has no knob {name!r}; its knobs: {', '.join(table)} "
                                   f"(trainops ablate --framework {framework} --list)")
        if str(value) not in table[name].values:
            raise FrameworkRefused(f"knob: {framework} {name}={value!r} is not accepted ({table[name].flag}); "
                                   f"use one of {', '.join(table[name].values)}")


def parse_value(text: str) -> object:
    """'2' -> 2, 'true' -> True, '5e8' -> 5e8, anything else stays a string."""
    try:
        return json.loads(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def split_override(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or "." not in key or not value:
        raise FrameworkRefused(f"--set: {item!r} is not section.key=value; e.g. --set training.steps=20")
    return key.strip(), value.strip()


def mfu(record: StepRecord, ctx: ParseContext | None) -> StepRecord:
    """Fill tflops and MFU with trainops' convention where the framework printed none, and say which."""
    if record.mfu_pct is not None:
        return record.model_copy(update={"mfu_source": "framework"})
    if ctx is None or not ctx.peak_tflops:
        return record
    tflops, source = record.tflops, "trainops-from-tflops"
    if tflops is None and record.tokens_per_s is not None and ctx.flops_per_token:
        tflops, source = record.tokens_per_s * ctx.flops_per_token / 1e12, "trainops-flops-convention"
    if tflops is None:
        return record
    return record.model_copy(update={"tflops": tflops, "mfu_pct": 100.0 * tflops / ctx.peak_tflops,
                                     "mfu_source": source})


def ingest_log(adapter: FrameworkAdapter, text: str, run_dir: str | Path, ctx: ParseContext | None = None,
               rank: int = 0) -> int:
    """Append the framework's step lines from a job log to `RUN/metrics.jsonl` as trainops records
    (for frameworks that write no metrics file), so summarize_run and the SOP read them; returns
    how many steps were written. Fields the framework did not print stay absent, not zero."""
    records = [adapter.parse_log_line(line, ctx) for line in text.splitlines()]
    lines = [json.dumps({"rank": rank, "time": time.time(), **r.model_dump(exclude_none=True)}) + "\n"
             for r in records if r is not None]
    with open(RunFiles(run_dir).metrics, "a", encoding="utf-8") as fh:
        fh.writelines(lines)
    return len(lines)


def known_frameworks() -> tuple[str, ...]:
    return get_args(FrameworkName)
