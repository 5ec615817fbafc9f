"""Metrics read back from a run folder, and a run summary that leaves warm-up steps out."""
from __future__ import annotations

import json
import time

import pytest

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.monitoring.prometheus import promql


def _write_run(workspace, name="r1", steps=6, ranks=2):
    run_dir = workspace / "runs" / name
    (run_dir / "heartbeat").mkdir(parents=True)
    now = time.time()
    lines = []
    for step in range(1, steps + 1):
        for rank in range(ranks):
            step_time = 5.0 if step == 1 else 0.1 + 0.02 * rank
            lines.append({"step": step, "rank": rank, "loss": 10.0 / step, "grad_norm": 1.0, "step_time_s": step_time,
                          "tokens_per_s": 1000.0, "mfu_pct": 40.0 + rank, "data_wait_s": 0.01,
                          "time": now - steps + step,
                          "peak_source": "measured GEMM"})
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    for rank in range(ranks):
        (run_dir / "heartbeat" / f"rank{rank}.json").write_text(json.dumps({"step": steps, "time": now - 3 * rank,
                                                                            "pid": 1}))
    return run_dir


def test_instant_returns_the_latest_value_per_rank(workspace):
    _write_run(workspace)
    out = call("query_metrics", {"run": "r1", "metric": "loss"})
    assert [(s.rank, s.step, s.value) for s in out.instant] == [(0, 6, pytest.approx(10 / 6)),
                                                                (1, 6, pytest.approx(10 / 6))]


def test_series_of_one_rank_holds_every_step_in_the_window(workspace):
    _write_run(workspace)
    out = call("query_metrics", {"run": "r1", "metric": "step_time_s", "rank": 1, "mode": "series"})
    assert len(out.series) == 1 and [s.step for s in out.series[0].samples] == [1, 2, 3, 4, 5, 6]


def test_heartbeat_age_comes_from_the_heartbeat_files(workspace):
    _write_run(workspace)
    ages = {s.rank: s.value for s in call("query_metrics", {"run": "r1", "metric": "heartbeat_age_s"}).instant}
    assert ages[0] < 1.0 and 2.9 < ages[1] < 4.0


def test_an_unknown_metric_lists_the_known_ones(workspace):
    _write_run(workspace)
    with pytest.raises(ToolError, match=r"metric 'mfu' is not in .*known metrics: .*mfu_pct"):
        call("query_metrics", {"run": "r1", "metric": "mfu"})


def test_summary_excludes_warmup_and_reports_spread_mfu_and_data_wait(workspace):
    _write_run(workspace)
    s = call("summarize_run", {"run": "r1", "skip_steps": 1})
    assert s.steps_measured == 5 and s.ranks == 2
    assert s.step_time_median_s == pytest.approx(0.12)
    assert s.step_time_rank_spread_pct == pytest.approx(100 * 0.02 / 0.11)
    assert s.mfu_pct_median == pytest.approx(40.5) and s.tokens_per_s_median == pytest.approx(2000.0)
    assert s.data_wait_share_pct == pytest.approx(100 * 0.02 / 0.22)
    assert s.final_loss == pytest.approx(10 / 6) and s.peak_source == "measured GEMM"


def test_an_unreachable_prometheus_names_the_url(monkeypatch):
    monkeypatch.setenv("TRAINOPS_PROMETHEUS_URL", "http://127.0.0.1:1")
    with pytest.raises(ToolError,
                       match=r"prometheus monitor: .*http://127\.0\.0\.1:1 failed.*check that Prometheus runs there"):
        call("query_metrics", {"run": "r1", "metric": "loss", "monitor": "prometheus", "url": "http://127.0.0.1:1"})


def test_the_promql_for_heartbeat_age_and_the_run_aggregates():
    assert promql("heartbeat_age_s", "r1", 0) == 'time() - timestamp(trainops_step{run="r1",rank="0"})'
    assert promql("step_time_spread_s", "r1") == ('max(trainops_step_time_s{run="r1"}) - '
                                                  'min(trainops_step_time_s{run="r1"})')
    assert promql("mfu_pct_avg", "r1") == 'avg(trainops_mfu_pct{run="r1"})'


def test_run_level_aggregates_average_mfu_and_sum_tokens_over_ranks(workspace):
    _write_run(workspace)
    value = {m: call("query_metrics", {"run": "r1", "metric": m}).instant[0].value
             for m in ("mfu_pct_avg", "tokens_per_s_sum", "step_time_spread_s")}
    assert value == {"mfu_pct_avg": pytest.approx(40.5), "tokens_per_s_sum": pytest.approx(2000.0),
                     "step_time_spread_s": pytest.approx(0.02)}


def test_per_node_folds_each_nodes_ranks_by_the_heartbeats_host(workspace):
    run_dir = _write_run(workspace, ranks=4)
    for rank in range(4):  # ranks 0-1 on n1, 2-3 on n2, as a 2-node job's heartbeats say
        beat = run_dir / "heartbeat" / f"rank{rank}.json"
        beat.write_text(json.dumps({**json.loads(beat.read_text()), "host": "n1" if rank < 2 else "n2"}))
    out = call("query_metrics", {"run": "r1", "metric": "step_time_s", "per_node": "max"})
    assert [s.node for s in out.instant] == ["n1", "n1", "n2", "n2"]
    assert out.nodes == {"n1": pytest.approx(0.12), "n2": pytest.approx(0.16)}
    summed = call("query_metrics", {"run": "r1", "metric": "tokens_per_s", "per_node": "sum"})
    assert summed.nodes == {"n1": 2000.0, "n2": 2000.0}
