"""PromQL built by code (issue 23, attack 8): the metric name must be a metric name, the run label
is always a matcher and values are escaped, so no model-chosen text becomes PromQL."""
from __future__ import annotations

import pytest

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.monitoring.base import MonitorError
from trainops.tools.monitoring.prometheus import promql, selector

INJECTIONS = ['loss{run="other"}', 'label_replace(up, "x", "$1", "job", "(.*)")', "loss or up", "loss)",
              "1loss", "loss\n", ""]


@pytest.mark.parametrize("metric", INJECTIONS)
def test_a_metric_that_is_not_a_metric_name_is_refused(metric):
    with pytest.raises(MonitorError, match="is not a metric name"):
        promql(metric, "r1")


@pytest.mark.parametrize("run", ['r1"} or up{x="', "r1\n", "../r1"])
def test_a_run_that_is_not_a_run_id_is_refused(run):
    with pytest.raises(MonitorError, match="is not a run id"):
        selector("loss", run)


def test_every_query_carries_the_run_matcher():
    for metric in ("loss", "heartbeat_age_s", "mfu_pct_avg", "step_time_spread_s", "custom:metric_1"):
        assert 'run="r1"' in promql(metric, "r1")


def test_query_metrics_refuses_the_injection_before_asking_the_server(monkeypatch):
    monkeypatch.setenv("TRAINOPS_PROMETHEUS_URL", "http://127.0.0.1:9")  # nothing listens: no request is made
    with pytest.raises(ToolError, match="is not a metric name"):
        call("query_metrics", {"run": "r1", "metric": INJECTIONS[1], "monitor": "prometheus"})
