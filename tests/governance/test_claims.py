"""Claim models refuse conclusions that break an evidence rule, naming the rule, the field and the fix."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from trainops.tools.governance.claims import (
    AblationArm,
    ExternalComparison,
    FaultToleranceConclusion,
    MfuClaim,
    RangeStatement,
    ScaleResult,
    SchedulerChange,
)


@pytest.fixture
def measured_run(workspace):
    run = workspace / "runs" / "run-1"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "rank": 0, "mfu_pct": 41.2}) + "\n")
    return "run-1"


def _mfu(**over):
    fields = dict(model="llama3-8b", hardware_generation="H100 SXM", parallel_layout="dp_shard=8 tp=2",
                  precision="bf16", framework="trainops-trainer (FSDP2)", framework_version="torch 2.13.0",
                  mfu_pct=41.2, source_run="run-1")
    return MfuClaim(**{**fields, **over})


@pytest.mark.rule("R-ENV-1", case="violation")
@pytest.mark.parametrize("field", ["model", "hardware_generation", "parallel_layout", "precision", "framework",
                                   "framework_version"])
def test_mfu_claim_without_a_declared_environment_field_is_refused(measured_run, field):
    with pytest.raises(ValidationError, match=rf"R-ENV-1: MfuClaim lacks {field}.*fix: declare the environment"):
        _mfu(**{field: None})


def test_mfu_claim_with_placeholder_version_is_refused(measured_run):
    with pytest.raises(ValidationError, match="R-ENV-1: MfuClaim lacks framework_version"):
        _mfu(framework_version="unknown")


@pytest.mark.rule("R-ENV-1", case="compliant")
@pytest.mark.rule("R-ENV-2", case="compliant")
def test_mfu_claim_with_declared_environment_and_measured_run_is_accepted(measured_run):
    assert _mfu().mfu_pct == 41.2


@pytest.mark.rule("R-ENV-2", case="violation")
def test_mfu_claim_citing_a_run_without_metrics_is_refused(measured_run):
    with pytest.raises(ValidationError, match=r"R-ENV-2: source_run='run-404' does not name a run folder"):
        _mfu(source_run="run-404")


BASE = {"parallel": {"tp": 1, "dp_shard": 2}, "training": {"activation_checkpointing": "full", "micro_batch": 2}}


@pytest.mark.rule("R-ABL-1", case="violation")
def test_ablation_arm_changing_two_settings_is_refused():
    arm = {"parallel": {"tp": 2, "dp_shard": 1}, "training": BASE["training"]}
    with pytest.raises(ValidationError, match=r"R-ABL-1: arm_config=\['parallel.dp_shard', 'parallel.tp'\] changes 2"):
        AblationArm(name="tp2", baseline_config=BASE, arm_config=arm)


def test_ablation_arm_identical_to_baseline_is_refused():
    with pytest.raises(ValidationError, match="R-ABL-1: arm_config=\\[\\] changes 0 settings"):
        AblationArm(name="noop", baseline_config=BASE, arm_config=BASE)


@pytest.mark.rule("R-ABL-1", case="compliant")
def test_ablation_arm_changing_one_setting_is_accepted():
    arm = {**BASE, "training": {**BASE["training"], "activation_checkpointing": "selective"}}
    changed = AblationArm(name="ac", baseline_config=BASE, arm_config=arm).changed_key
    assert changed == "training.activation_checkpointing"


def _scale(**over):
    fields = dict(knob="training.activation_checkpointing", small_world_size=2, small_gain_pct=3.0,
                  target_world_size=8, target_gain_pct=2.5, weak_scaling_efficiency_pct=93.0, rollout="continue")
    return ScaleResult(**{**fields, **over})


@pytest.mark.rule("R-ABL-2", case="violation")
def test_target_scale_result_without_small_scale_reproduction_is_refused():
    with pytest.raises(ValidationError, match="R-ABL-2: small_gain_pct=None is missing"):
        _scale(small_world_size=None, small_gain_pct=None)


def test_small_scale_not_below_target_is_refused():
    with pytest.raises(ValidationError, match="R-ABL-2: small_world_size=8 is not below target_world_size=8"):
        _scale(small_world_size=8)


@pytest.mark.rule("R-ABL-2", case="compliant")
@pytest.mark.rule("R-EVD-4", case="compliant")
def test_small_then_target_scale_with_weak_scaling_efficiency_is_accepted():
    assert _scale().rollout == "continue"


@pytest.mark.rule("R-ABL-3", case="violation")
def test_continuing_rollout_after_the_gain_vanished_at_scale_is_refused():
    with pytest.raises(ValidationError, match=r"R-ABL-3: rollout='continue' continues although the gain vanished"):
        _scale(target_gain_pct=-0.4, rollout="continue")


@pytest.mark.rule("R-ABL-3", case="compliant")
def test_stopping_rollout_after_the_gain_vanished_is_accepted():
    assert _scale(target_gain_pct=-0.4, rollout="stop").rollout == "stop"


@pytest.mark.rule("R-EVD-4", case="violation")
@pytest.mark.parametrize("over", [{"comparison_metric": "absolute_throughput"}, {"weak_scaling_efficiency_pct": None}])
def test_cross_scale_comparison_without_weak_scaling_efficiency_is_refused(over):
    with pytest.raises(ValidationError, match="R-EVD-4: comparison_metric="):
        _scale(**over)


@pytest.fixture
def drill_record(tmp_path):
    path = tmp_path / "drill.json"
    path.write_text('{"fault": "crash"}')
    return str(path)


@pytest.mark.rule("R-EVD-2", case="violation")
@pytest.mark.parametrize("missing", ["detection_latency_s", "isolation_granularity", "recovery_time_s", "drill_record"])
def test_fault_tolerance_conclusion_missing_a_figure_is_refused(drill_record, missing):
    fields = dict(fault="crash", detection_latency_s=4.2, isolation_granularity="node", recovery_time_s=38.0,
                  drill_record=drill_record)
    with pytest.raises(ValidationError, match=rf"R-EVD-2: FaultToleranceConclusion lacks {missing}"):
        FaultToleranceConclusion(**{**fields, missing: None})


def test_fault_tolerance_conclusion_with_missing_drill_file_is_refused(tmp_path):
    with pytest.raises(ValidationError, match="R-EVD-2: drill_record=.* is not an existing file"):
        FaultToleranceConclusion(fault="hang", detection_latency_s=1, isolation_granularity="rank",
                                 recovery_time_s=2, drill_record=str(tmp_path / "nope.json"))


@pytest.mark.rule("R-EVD-2", case="compliant")
def test_fault_tolerance_conclusion_with_three_figures_and_record_is_accepted(drill_record):
    c = FaultToleranceConclusion(fault="crash", detection_latency_s=4.2, isolation_granularity="node",
                                 recovery_time_s=38.0, drill_record=drill_record)
    assert c.recovery_time_s == 38.0


@pytest.mark.rule("R-EVD-3", case="violation")
@pytest.mark.parametrize("missing", ["source", "scale_difference"])
def test_external_comparison_without_source_or_scale_difference_is_refused(missing):
    fields = dict(metric="MFU", ours="38.5%", theirs="55.2%", source="MegaScale (NSDI 2024)",
                  scale_difference="8 H100 vs 12,288 GPUs")
    with pytest.raises(ValidationError, match=rf"R-EVD-3: ExternalComparison lacks {missing}"):
        ExternalComparison(**{**fields, missing: ""})


@pytest.mark.rule("R-EVD-3", case="compliant")
def test_external_comparison_naming_source_and_scale_is_accepted():
    c = ExternalComparison(metric="MFU", ours="38.5%", theirs="55.2%", source="MegaScale (NSDI 2024)",
                           scale_difference="8 H100 vs 12,288 GPUs")
    assert c.source.startswith("MegaScale")


@pytest.mark.rule("R-EVD-1", case="violation")
def test_range_without_a_basis_is_refused():
    with pytest.raises(ValidationError, match="R-EVD-1: basis=None is missing"):
        RangeStatement(quantity="dense MFU", low=40, high=55, unit="%")


def test_benchmark_range_without_source_is_refused():
    with pytest.raises(ValidationError, match="R-EVD-1: source=None is missing for a official_benchmark range"):
        RangeStatement(quantity="dense MFU", low=40, high=55, unit="%", basis="official_benchmark")


@pytest.mark.rule("R-EVD-1", case="compliant")
def test_experiential_range_renders_with_its_label():
    r = RangeStatement(quantity="dense-model MFU on H100", low=40, high=55, unit="%", basis="experiential")
    assert r.text() == "dense-model MFU on H100: 40~55% (experiential range, not an official benchmark)"


@pytest.mark.rule("R-SCH-1", case="violation")
@pytest.mark.parametrize("impact", [None, "", "TBD"])
def test_scheduler_change_without_its_impact_is_refused(impact):
    with pytest.raises(ValidationError, match="R-SCH-1: SchedulerChange lacks impact"):
        SchedulerChange(impact=impact)


def test_scheduler_change_takes_no_caller_supplied_shadow_result():
    assert set(SchedulerChange.model_fields) == {"impact"}  # the replay and rollback are trainops' own


@pytest.mark.rule("R-SCH-1", case="compliant")
def test_scheduler_change_with_its_impact_is_accepted():
    assert SchedulerChange(impact="partition gpu-a: tenants acme, globex").impact.startswith("partition gpu-a")
