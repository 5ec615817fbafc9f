"""Training metrics behind one protocol: `embedded` (the run's own files) and `prometheus`.

`get_monitor(kind)` is the one way to pick a backend; it lives here, above the backends, which
import only the contract (`base`)."""
from __future__ import annotations

from typing import get_args

from trainops.tools.monitoring.base import Monitor, MonitorError, MonitorKind, Sample, Series
from trainops.tools.monitoring.embedded import EmbeddedMonitor
from trainops.tools.monitoring.prometheus import PrometheusMonitor
from trainops.tools.monitoring.replay import replay_monitor

__all__ = ["Monitor", "MonitorError", "Sample", "Series", "get_monitor"]


def get_monitor(kind: str, url: str | None = None) -> Monitor:
    """The backend for `kind`; while a recorded scenario is replayed, every kind serves its snapshot."""
    if (replay := replay_monitor(kind)) is not None:
        return replay
    if kind == "embedded":
        return EmbeddedMonitor()
    if kind == "prometheus":
        return PrometheusMonitor(url)
    raise MonitorError(kind, f"unknown monitor {kind!r}: use {' or '.join(get_args(MonitorKind))}")
