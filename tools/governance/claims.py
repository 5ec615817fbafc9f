"""Claims and evidence as validated models: a conclusion that breaks an AGENTS.md rule cannot
be constructed. Every message starts with the rule ID, names the field and the value seen,
and says what to do. The evidence pack is built from these blocks; text.validate_report_text
checks the rendered report (and builds a `RangeStatement` from each percentage range in it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from trainops.run_folder import RunFiles
from trainops.workspace import run_folder

_PLACEHOLDER_VALUES = {"", "?", "??", "???", "-", "n/a", "na", "none", "null", "unknown", "tbd", "todo", "xxx", "tba"}


def is_placeholder(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in _PLACEHOLDER_VALUES)


def rule_message(rule_id: str, field: str, value: Any, problem: str, fix: str) -> str:
    return f"{rule_id}: {field}={value!r} {problem}; fix: {fix}"


def _require(model: BaseModel, rule_id: str, fields: list[str], fix: str) -> None:
    missing = [f for f in fields if is_placeholder(getattr(model, f))]
    if missing:
        seen = {f: getattr(model, f) for f in missing}
        raise ValueError(f"{rule_id}: {type(model).__name__} lacks {', '.join(missing)} (got {seen}); fix: {fix}")


class MfuClaim(BaseModel):
    """An MFU or scaling conclusion, valid only with its declared environment (R-ENV-1) and
    the measured run it comes from (R-ENV-2)."""
    model: str | None = Field(None, description="Model and size, e.g. 'llama3-8b'.")
    hardware_generation: str | None = Field(None, description="Accelerator generation, e.g. 'H100 SXM'.")
    parallel_layout: str | None = Field(None, description="Parallel strategy, e.g. 'dp_shard=8 tp=2 pp=1'.")
    precision: str | None = Field(None, description="Compute precision, e.g. 'bf16'.")
    framework: str | None = Field(None, description="Training framework, e.g. 'trainops-trainer (torch FSDP2)'.")
    framework_version: str | None = Field(None, description="Framework version, e.g. 'torch 2.13.0'.")
    mfu_pct: float = Field(ge=0, le=100, description="Model FLOPs utilisation in percent.")
    source_run: str | None = Field(None,
                                   description="Run id under $TRAINOPS_HOME/runs or a run folder with metrics.jsonl.")

    @model_validator(mode="after")
    def _declared(self) -> "MfuClaim":
        _require(self, "R-ENV-1", ["model", "hardware_generation", "parallel_layout", "precision", "framework",
                                   "framework_version"],
                 "declare the environment first (`trainops env`) and copy model, hardware generation, parallel "
                 "layout, precision, framework and version into the claim")
        if is_placeholder(self.source_run) or resolve_run(self.source_run) is None:
            raise ValueError(rule_message("R-ENV-2", "source_run", self.source_run,
                                          "does not name a run folder with metrics.jsonl",
                                          "cite the measured run (`trainops train --json` prints run_dir)"))
        return self


def resolve_run(run: str) -> Path | None:
    """The run folder of a run id or path (confined to the workspace: trainops.workspace.run_folder),
    if it holds measured metrics; None otherwise."""
    try:
        folder = run_folder(run, "source_run")
    except ValueError:
        return None
    return folder if RunFiles(folder).metrics.is_file() else None


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


class AblationArm(BaseModel):
    """One ablation arm against its baseline: exactly one setting may differ (R-ABL-1)."""
    name: str = Field(description="What the arm tests, e.g. 'activation checkpointing off'.")
    baseline_config: dict[str, Any] = Field(description="The baseline job config (nested sections allowed).")
    arm_config: dict[str, Any] = Field(description="The arm's job config.")
    baseline_mfu_pct: float | None = Field(None, ge=0, le=100)
    arm_mfu_pct: float | None = Field(None, ge=0, le=100)

    @property
    def changed_keys(self) -> list[str]:
        base, arm = _flatten(self.baseline_config), _flatten(self.arm_config)
        return sorted(k for k in base.keys() | arm.keys() if base.get(k, object()) != arm.get(k, object()))

    @property
    def changed_key(self) -> str:
        return self.changed_keys[0]

    @model_validator(mode="after")
    def _single_variable(self) -> "AblationArm":
        changed = self.changed_keys
        if len(changed) != 1:
            raise ValueError(rule_message("R-ABL-1", "arm_config", changed,
                                          f"changes {len(changed)} settings against the baseline, not exactly one",
                                          "split it into one arm per setting so each gain is attributable"))
        return self


class ScaleResult(BaseModel):
    """A gain measured small first, then at target scale, compared by weak-scaling efficiency."""
    knob: str = Field(description="The single setting the ablation changed, e.g. 'parallel.tp'.")
    small_world_size: int | None = Field(None, ge=1, description="Processes/GPUs of the small-scale reproduction.")
    small_gain_pct: float | None = Field(None, description="MFU gain of the arm at small scale, in points.")
    target_world_size: int = Field(ge=1, description="Processes/GPUs at target scale.")
    target_gain_pct: float | None = Field(None, description="MFU gain at target scale; None before it has run.")
    comparison_metric: Literal["weak_scaling_efficiency", "absolute_throughput"] = "weak_scaling_efficiency"
    weak_scaling_efficiency_pct: float | None = Field(None, ge=0,
                                                      description="Per-device throughput at target over small scale, "
                                                                  "in percent.")
    min_gain_pct: float = Field(0.0, description="A target gain at or below this means the gain vanished.")
    rollout: Literal["continue", "stop"] = Field(description="Continue to (or at) target scale, or stop and roll back.")

    @model_validator(mode="after")
    def _small_first(self) -> "ScaleResult":
        if self.small_world_size is None or self.small_gain_pct is None:
            raise ValueError(rule_message("R-ABL-2", "small_gain_pct", self.small_gain_pct,
                                          "is missing: a target-scale result needs its small-scale reproduction",
                                          "run the arm at small scale first and record small_world_size and "
                                          "small_gain_pct"))
        if self.small_world_size >= self.target_world_size:
            raise ValueError(rule_message("R-ABL-2", "small_world_size", self.small_world_size,
                                          f"is not below target_world_size={self.target_world_size}",
                                          "reproduce on fewer devices than the target"))
        if self.target_gain_pct is not None:
            if self.comparison_metric != "weak_scaling_efficiency" or self.weak_scaling_efficiency_pct is None:
                raise ValueError(rule_message("R-EVD-4", "comparison_metric", self.comparison_metric,
                                              "compares scales without a weak-scaling efficiency",
                                              "set comparison_metric='weak_scaling_efficiency' and give "
                                              "weak_scaling_efficiency_pct (per-device throughput ratio)"))
            if self.target_gain_pct <= self.min_gain_pct and self.rollout != "stop":
                raise ValueError(rule_message("R-ABL-3", "rollout", self.rollout,
                                              f"continues although the gain vanished at scale "
                                              f"({self.small_gain_pct} -> {self.target_gain_pct} points)",
                                              "set rollout='stop', roll back the change and record why"))
        return self


IsolationGranularity = Literal["rank", "node", "replica_group", "switch", "rack", "job"]


class FaultToleranceConclusion(BaseModel):
    """A fault-tolerance result: the three figures together, backed by a drill record (R-EVD-2)."""
    fault: str = Field(description="The injected fault, e.g. 'crash', 'hang', 'sdc', 'straggler'.")
    detection_latency_s: float | None = Field(None, ge=0, description="Fault injected -> detected.")
    isolation_granularity: IsolationGranularity | None = Field(None, description="The smallest unit taken out.")
    recovery_time_s: float | None = Field(None, ge=0, description="Detected -> training again.")
    drill_record: str | None = Field(None, description="Path of the drill record (JSON/log) the figures come from.")

    @model_validator(mode="after")
    def _complete(self) -> "FaultToleranceConclusion":
        _require(self, "R-EVD-2", ["detection_latency_s", "isolation_granularity", "recovery_time_s", "drill_record"],
                 "run `trainops drill CFG --fault F` and report all three figures with its record")
        if not Path(self.drill_record).is_file():
            raise ValueError(rule_message("R-EVD-2", "drill_record", self.drill_record, "is not an existing file",
                                          "point at the drill record the figures were measured in"))
        return self


class ExternalComparison(BaseModel):
    """Our figure next to a public breakdown (MegaScale, Llama 3, MLPerf): source and scale named (R-EVD-3)."""
    metric: str
    ours: str
    theirs: str
    source: str | None = Field(None, description="Publication and table, e.g. 'MegaScale (NSDI 2024), Table 2'.")
    scale_difference: str | None = Field(None, description="e.g. '2 CPU processes vs 12,288 GPUs'.")

    @model_validator(mode="after")
    def _sourced(self) -> "ExternalComparison":
        _require(self, "R-EVD-3", ["source", "scale_difference"],
                 "name the publication and the scale (and hardware generation) difference")
        return self


class RangeStatement(BaseModel):
    """A range of values: its basis is stated, experiential ranges are labelled as such (R-EVD-1)."""
    quantity: str = Field(description="What the range is of, e.g. 'dense-model MFU on H100'.")
    low: float
    high: float
    unit: str = Field(description="Unit written right after the number, e.g. '%', 'B', ' s'.")
    basis: Literal["measured", "official_benchmark", "experiential"] | None = None
    source: str | None = Field(None, description="Run or publication, required unless the range is experiential.")

    @model_validator(mode="after")
    def _labelled(self) -> "RangeStatement":
        if self.basis is None:
            raise ValueError(rule_message("R-EVD-1", "basis", None, "is missing",
                                          "say whether the range is 'measured', 'official_benchmark' or "
                                          "'experiential'"))
        if self.basis != "experiential" and is_placeholder(self.source):
            raise ValueError(rule_message("R-EVD-1", "source", self.source, f"is missing for a {self.basis} range",
                                          "cite the run or benchmark, or label the range basis='experiential'"))
        if self.low > self.high:
            raise ValueError(rule_message("R-EVD-1", "low", self.low, f"exceeds high={self.high}", "swap them"))
        if self.unit.strip() == "%" and "mfu" in self.quantity.lower() and self.high > 100:
            raise ValueError(rule_message("R-EVD-1", "high", self.high, "is an MFU above 100% of peak",
                                          "check the device's peak FLOP/s: MFU cannot exceed 100%"))
        return self

    def text(self) -> str:
        label = {"experiential": "experiential range, not an official benchmark",
                 "official_benchmark": f"official benchmark: {self.source}",
                 "measured": f"measured: {self.source}"}[self.basis or "experiential"]
        return f"{self.quantity}: {self.low:g}~{self.high:g}{self.unit} ({label})"


class SchedulerChange(BaseModel):
    """What the caller of a scheduler policy change states (R-SCH-1): its impact. The shadow-queue
    result and the rollback commands are never the caller's: change_scheduler_policy replays the
    change and generates them itself (tools/changes/scheduler_policy.py)."""
    impact: str | None = Field(None, description="Who and what the change affects (partitions, tenants, jobs).")

    @model_validator(mode="after")
    def _complete(self) -> "SchedulerChange":
        _require(self, "R-SCH-1", ["impact"], "describe who and what the change affects")
        return self


__all__ = ["MfuClaim", "AblationArm", "ScaleResult", "FaultToleranceConclusion", "ExternalComparison",
           "RangeStatement", "SchedulerChange", "is_placeholder"]
