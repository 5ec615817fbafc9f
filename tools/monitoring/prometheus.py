"""Metrics from a Prometheus server that scrapes the trainer's per-rank exporters
(`trainops_<metric>{run, rank}`), through prometheus-api-client.

`query_metrics` is a read tool the agent calls freely, so it talks only to servers the user
configured: `[monitoring] prometheus_urls` in the user's own (trusted) config and
`$TRAINOPS_PROMETHEUS_URL`, else the local default. A URL from a tool input, a model or a
project-local file is refused, and a failure never echoes the server's answer (no SSRF probe
that reads internal pages back)."""
from __future__ import annotations

import os
import re

from urllib3.util.retry import Retry

from trainops.settings import SettingsError, table, user_config_path
from trainops.tools.monitoring.base import AGGREGATES, HEARTBEAT_AGE, MonitorError, Sample, Series
from trainops.workspace import is_valid_id

KIND = "prometheus"
DEFAULT_URL = "http://127.0.0.1:9090"
ENV_URL = "TRAINOPS_PROMETHEUS_URL"


def _normal(url: str) -> str:
    return url.strip().rstrip("/")


def configured_urls() -> list[str]:
    """The Prometheus servers trainops may query, in order of preference."""
    try:
        values, sources = table("monitoring", trusted_only=True)
    except SettingsError as exc:
        raise MonitorError(KIND, str(exc)) from None
    listed = values.get("prometheus_urls", [])
    if not isinstance(listed, list) or not all(isinstance(u, str) and u.strip() for u in listed):
        where = sources.get("prometheus_urls", f"[monitoring] prometheus_urls in {user_config_path()}")
        raise MonitorError(KIND, f"{where} must be a list of URLs, e.g. prometheus_urls = [\"http://prom:9090\"]")
    env = os.environ.get(ENV_URL, "").strip()
    return [_normal(u) for u in ([env] if env else []) + listed] or [DEFAULT_URL]


def allowed_url(url: str | None) -> str:
    """`url` when it is a configured server (None: the first one); otherwise a MonitorError saying how to add it."""
    urls = configured_urls()
    if url is None:
        return urls[0]
    if _normal(url) not in urls:
        raise MonitorError(KIND, f"url={url!r} is not a configured Prometheus server (configured: {', '.join(urls)}); "
                                 f"query_metrics talks only to servers listed under [monitoring] prometheus_urls in "
                                 f"{user_config_path()} or in ${ENV_URL}: add it there, or omit url")
    return _normal(url)


def _failure(exc: Exception) -> str:
    """What went wrong, without the server's answer: its body is never echoed back."""
    status = re.search(r"HTTP Status Code (\d+)", str(exc))
    return f"HTTP {status.group(1)}" if status else type(exc).__name__


METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")  # the exposition format's metric name grammar
MAX_METRIC_CHARS = 200


def check_metric(metric: str) -> str:
    """`metric` when it is a metric name in the exposition-format grammar; a MonitorError otherwise.
    The name is the only model-chosen text in a query, so `label_replace(...)`, `}` or `or` never
    reach Prometheus as PromQL."""
    if not isinstance(metric, str) or len(metric) > MAX_METRIC_CHARS or not METRIC_NAME.fullmatch(metric):
        raise MonitorError(KIND, f"metric={metric!r} is not a metric name: use letters, digits, '_' and ':' "
                                 "(not starting with a digit), e.g. loss or step_time_s; a query is built by trainops, "
                                 "never taken from the caller")
    return metric


def _label(value: str) -> str:
    """A label value as a PromQL string literal's body: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def selector(metric: str, run: str, rank: int | None = None) -> str:
    """`trainops_METRIC{run="RUN"[,rank="R"]}`: the run matcher is always there, so a query sees one
    run's series and nothing else; the name is checked against the grammar, the values escaped."""
    if not is_valid_id(run):
        raise MonitorError(KIND, f"run={run!r} is not a run id: use the run id the submit returned")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise MonitorError(KIND, f"rank={rank!r} is not a rank: use a whole number >= 0")
    labels = f'run="{_label(run)}"' + ("" if rank is None else f',rank="{rank}"')
    return f"trainops_{check_metric(metric)}{{{labels}}}"


def promql(metric: str, run: str, rank: int | None = None) -> str:
    """The PromQL for one of our metrics; heartbeat age is the time since the last scraped step."""
    check_metric(metric)
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
        self.url = allowed_url(url)

    def _client(self):
        from prometheus_api_client import PrometheusConnect

        # one quick retry: a drill must not spend seconds in the client's default backoff
        return PrometheusConnect(url=self.url, disable_ssl=True, retry=Retry(total=1, backoff_factor=0.1), timeout=10)

    def query(self, expr: str) -> list[dict]:
        """Run an instant PromQL query; an unreachable server is a MonitorError naming the URL."""
        try:
            return self._client().custom_query(query=expr)
        except Exception as exc:
            raise MonitorError(KIND, f"query {expr!r} at {self.url} failed ({_failure(exc)}); check that Prometheus "
                                     f"runs there (GET {self.url}/-/ready) or configure the right url") from None

    def instant(self, metric: str, run: str, rank: int | None = None) -> list[Sample]:
        out = []
        for item in self.query(promql(metric, run, rank)):
            ts, value = item["value"]
            r = item["metric"].get("rank")
            out.append(Sample(rank=None if r is None else int(r), time=float(ts), value=float(value),
                              node=item["metric"].get("node")))
        return sorted(out, key=lambda s: (s.rank is None, s.rank))

    def series(self, metric: str, run: str, rank: int | None = None, window_s: float = 300.0) -> list[Series]:
        expr = f"{promql(metric, run, rank)}"
        if metric == HEARTBEAT_AGE:
            return [Series(metric=metric, run=run, rank=s.rank, samples=[s]) for s in self.instant(metric, run, rank)]
        seconds = max(1, int(window_s))
        out = []
        for item in self.query(f"{expr}[{seconds}s]"):
            r = item["metric"].get("rank")
            samples = [Sample(rank=None if r is None else int(r), time=float(t), value=float(v)) for t,
                       v in item["values"]]
            out.append(Series(metric=metric, run=run, rank=None if r is None else int(r), samples=samples))
        return sorted(out, key=lambda s: (s.rank is None, s.rank))
