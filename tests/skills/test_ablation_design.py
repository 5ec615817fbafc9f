"""S3 follows the measurement (issue 40): the arms rank by what the baseline's own split says they
could save, not by a fixed category order; every arm carries the figure it acts on and why."""
from __future__ import annotations

import json

import pytest

from trainops.agents.agent_tools import agent_registry
from trainops.skills import ablation
from trainops.skills.ablation_design import design, split_of
from trainops.skills.evidence.model import MetricSpread
from trainops.skills.evidence.pack import assemble, load, write
from trainops.skills.request import JobRequest
from trainops.skills.sop_session import SopSettings
from trainops.skills.sop_steps import design_arms
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.workspace import runs_dir

OPERATOR = CallContext(actor="operator")
ARMS = ["activation_checkpointing=selective", "micro_batch=4", "data_kind=synthetic", "pp_schedule=1F1B",
        "compile=true", "data_parallel=ddp"]


def summary(factories, exposed: float | None, data: float, mfu: float = 45.0):
    """A recorded baseline's summary with the split under test (a GPU-like MFU, so compute is not all
    headroom)."""
    return factories.baseline(["runs/base-1", "runs/base-2", "runs/base-3"]).model_copy(update={
        "exposed_comm_share_pct": exposed, "data_wait_share_pct": data,
        "mfu_pct": MetricSpread(median=mfu, low=mfu - 0.5, high=mfu + 0.5, spread_pct=2.0)})


def test_communication_and_data_bound_baselines_get_different_top_arms_each_with_figure_and_reason(factories):
    comm = design(split_of(summary(factories, exposed=31.0, data=2.0)), ARMS)
    data = design(split_of(summary(factories, exposed=3.0, data=40.0)), ARMS)
    assert comm[0].arm == "data_parallel=ddp" and data[0].arm == "data_kind=synthetic"
    assert comm[0].figure.text == "exposed communication 31.0% of step time" and comm[0].bound_pct == 31.0
    assert "only exposed communication can be hidden" in comm[0].reason
    assert data[0].figure.text == "data loading 40.0% of step time" and data[0].bound_pct == 40.0
    assert "waits for data 40.0%" in data[0].reason
    assert [a.rank for a in comm] == list(range(1, len(ARMS) + 1))
    assert all(a.reason and a.figure.text for a in comm + data)


def test_compute_is_bounded_by_what_it_would_take_at_peak_and_ties_keep_the_category_order(factories):
    """Kernels and batch both act on compute: 100 - 31 - 2 = 67% of the step, of which 45% (the MFU)
    is compute at peak, so each saves at most 22%; kernels come before batch."""
    ranked = [a.arm for a in design(split_of(summary(factories, exposed=31.0, data=2.0)), ARMS)]
    assert ranked[:4] == ["data_parallel=ddp", "compile=true", "micro_batch=4", "data_kind=synthetic"]
    compile_arm = design(split_of(summary(factories, exposed=31.0, data=2.0)), ["compile=true"])[0]
    assert compile_arm.figure.value_pct == pytest.approx(67.0) and compile_arm.bound_pct == pytest.approx(22.0)


def test_an_arm_on_an_unmeasured_figure_ranks_after_the_measured_ones_and_says_so(factories):
    ranked = design(split_of(summary(factories, exposed=None, data=5.0, mfu=90.0)), ARMS)
    names = [a.arm for a in ranked]
    overlap = ranked[names.index("data_parallel=ddp")]
    assert names.index("data_parallel=ddp") > names.index("data_kind=synthetic")
    assert names.index("data_parallel=ddp") > names.index("micro_batch=4")  # 5% bound, still measured
    assert overlap.bound_pct is None and overlap.figure.text == "exposed communication: not measured"
    assert "not measured" in overlap.reason
    assert ranked[names.index("pp_schedule=1F1B")].figure.value_pct is None


def test_memory_arms_say_they_trade_speed_and_go_last_unless_memory_is_the_problem(factories):
    split = split_of(summary(factories, exposed=31.0, data=2.0))
    last = design(split, ARMS)[-1]
    assert last.arm == "activation_checkpointing=selective" and "trades speed for memory" in last.reason
    assert design(split, ARMS, memory_bound=True)[0].arm == "activation_checkpointing=selective"


def test_the_sop_runs_the_arms_in_the_design_order_from_s2s_summary(factories, monkeypatch):
    """S3 of `trainops sop`: the quick SOP keeps the first-ranked default arm, which is the data arm
    for a data-bound baseline (the framework lists ddp first); S4's run_plan climbs in that order."""
    data_bound = summary(factories, exposed=3.0, data=40.0)
    quick = SopSettings(quick=True)
    designed = design_arms(quick, data_bound)
    assert [a.arm for a in designed] == ["data_kind=synthetic", "data_parallel=ddp"]
    assert quick.plan(designed) == ["data_kind=synthetic"]
    assert SopSettings().plan(design_arms(SopSettings(), summary(factories, exposed=31.0, data=2.0))) == [
        "data_parallel=ddp", "data_kind=synthetic"]
    climbed = []
    monkeypatch.setattr(ablation, "run_arm", lambda req, spec, *args: (climbed.append(spec), ([], []))[1])
    ablation.run_plan(JobRequest(), ["data_parallel=ddp", "data_kind=synthetic"], {}, 1,
                      env=factories.environment(), summary=data_bound)
    assert climbed == ["data_kind=synthetic", "data_parallel=ddp"]


def test_the_pack_carries_the_design_and_its_report_passes_the_text_rules(factories, workspace):
    """Written through governance (R-OUT-1..3 on the report), read back with each arm's figure and
    reason, and the report's S3 table shows them."""
    run = factories.write_run(runs_dir() / "base-1")
    base = factories.baseline([str(run)])
    designed = design(split_of(base.model_copy(update={"exposed_comm_share_pct": 31.0})), ARMS)
    folder = write(assemble("pack-design", factories.environment(), base, [factories.ablation()], [], [],
                            ablation_design=designed))
    assert [a.arm for a in load(folder).ablation_design] == [a.arm for a in designed]
    report = (folder / "report.md").read_text()
    assert "exposed communication 31.0% of step time" in report and "none, costs speed" in report
    assert designed[0].reason in report


def _recorded(factories, workspace, name: str, data_wait_s: float, exposed_us: float) -> str:
    """A recorded baseline run: metrics with the step's data wait, and one rank's profiler trace with
    `exposed_us` of collectives no compute hid in a 1000 us step."""
    run_dir = factories.write_run(workspace / "runs" / name)
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace('"data_wait_s": 0.01', f'"data_wait_s": {data_wait_s}'))
    events = [{"ph": "X", "name": "train_step#3", "ts": 0, "dur": 1000, "tid": 1, "cat": "user_annotation"},
              {"ph": "X", "name": "gloo:all_reduce", "ts": 0, "dur": exposed_us, "tid": 1, "cat": "cpu_op"},
              {"ph": "X", "name": "aten::mm", "ts": exposed_us, "dur": 1000 - exposed_us, "tid": 1, "cat": "cpu_op"}]
    (run_dir / "profile").mkdir()
    (run_dir / "profile" / "rank0.json").write_text(json.dumps({"traceEvents": events}))
    return name


def test_the_read_tool_designs_from_recorded_run_folders(factories, workspace):
    comm = _recorded(factories, workspace, "comm-bound", data_wait_s=0.002, exposed_us=400)
    data = _recorded(factories, workspace, "data-bound", data_wait_s=0.05, exposed_us=20)
    by_comm = call("ablation_design", {"runs": [comm]}, OPERATOR, registry=agent_registry())
    by_data = call("ablation_design", {"runs": [data]}, OPERATOR, registry=agent_registry())
    assert by_comm.split.exposed_comm_pct == pytest.approx(40.0) and by_data.split.data_wait_pct > 30
    assert by_comm.arms[0].arm == "data_parallel=ddp" and by_data.arms[0].arm == "data_kind=synthetic"
    assert by_comm.arms[0].figure.text == "exposed communication 40.0% of step time"
    with pytest.raises(ToolError, match="unknown knob 'warp'"):
        call("ablation_design", {"runs": [comm], "knobs": ["warp=1"]}, OPERATOR, registry=agent_registry())
    with pytest.raises(ToolError, match="outside the workspace"):
        call("ablation_design", {"runs": ["../../etc"]}, OPERATOR, registry=agent_registry())
