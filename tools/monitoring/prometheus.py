"""Metrics from a Prometheus server that scrapes the trainer's per-rank exporters
(`trainops_<metric>{run, rank}`), through prometheus-api-client."""
from __future__ import annotations

import os
import time

from trainops.tools.monitoring.base import AGGREGATES, HEARTBEAT_AGE, MonitorError, Sample, Series

KIND = "prometheus"
DEFAULT_URL = "http://127.0.0.1:9090"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def selector(metric: str, run: str, rank: int | None = None) -> str:
    labels = f'run="{_label(run)}"' + ("" if rank is None else f',rank="{rank}"')
    return f"trainops_{metric}{{{labels}}}"


def promql(metric: str, run: str, rank: int | None = None) -> str:
    """The PromQL for one of our metrics; heartbeat age is the time since the last scraped step."""
    if metric == HEARTBEAT_AGE:
        return f"time() - timestamp({selector('step', run, rank)})"
    if metric in AGGREGATES:
        return aggregate_query(metric, run)
    return selector(metric, run, rank)


def aggregate_query(name: str, run: str) -> str:
    """PromQL for a run-level aggregate: avg MFU, summed tokens/s, per-rank step-time spread."""
    metric, how = AGGREGATES[name]
    sel = selector(metric, run)
    if how == "spread":
        return f"max({sel}) - min({sel})"
    return f"{how}({sel})"


class PrometheusMonitor:
    kind = KIND

    def __init__(self, url: str | None = None):
        self.url = url or os.environ.get("TRAINOPS_PROMETHEUS_URL", DEFAULT_URL)

    def _client(self):
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        # one quick retry: a drill must not spend seconds in the client's default backoff
        return PrometheusConnect(url=self.url, disable_ssl=True, retry=Retry(total=1, backoff_factor=0.1), timeout=10)

    def query(self, expr: str) -> list[dict]:
        """Run an instant PromQL query; an unreachable server is a MonitorError naming the URL."""
        try:
            return self._client().custom_query(query=expr)
        except Exception as exc:
            raise MonitorError(KIND, f"query {expr!r} at {self.url} failed ({type(exc).__name__}: {str(exc)[:200]}); check that Prometheus runs there (GET {self.url}/-/ready) or pass the right url") from None

    def instant(self, metric: str, run: str, rank: int | None = None) -> list[Sample]:
        out = []
        for item in self.query(promql(metric, run, rank)):
            ts, value = item["value"]
            r = item["metric"].get("rank")
            out.append(Sample(rank=None if r is None else int(r), time=float(ts), value=float(value)))
        return sorted(out, key=lambda s: (s.rank is None, s.rank))

    def series(self, metric: str, run: str, rank: int | None = None, window_s: float = 300.0) -> list[Series]:
        expr = f"{promql(metric, run, rank)}"
        if metric == HEARTBEAT_AGE:
            return [Series(metric=metric, run=run, rank=s.rank, samples=[s]) for s in self.instant(metric, run, rank)]
        seconds = max(1, int(window_s))
        out = []
        for item in self.query(f"{expr}[{seconds}s]"):
            r = item["metric"].get("rank")
            samples = [Sample(rank=None if r is None else int(r), time=float(t), value=float(v)) for t, v in item["values"]]
            out.append(Series(metric=metric, run=run, rank=None if r is None else int(r), samples=samples))
        return sorted(out, key=lambda s: (s.rank is None, s.rank))
