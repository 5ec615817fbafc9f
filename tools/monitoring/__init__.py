"""Training metrics behind one protocol: `embedded` (the run's own files) and `prometheus`.

`get_monitor(kind)` is the one way to pick a backend; it lives here, above the backends, which
import only the contract (`base`). A caller that brings its own monitor puts it in through
`trainops.tools.backends.backends`, the one seam, never here."""
from __future__ import annotations

from typing import get_args

from trainops.tools.backends import injected
from trainops.tools.monitoring.base import Monitor, MonitorError, MonitorKind, Sample, Series
from trainops.tools.monitoring.embedded import EmbeddedMonitor
from trainops.tools.monitoring.prometheus import PrometheusMonitor

__all__ = ["Monitor", "MonitorError", "Sample", "Series", "get_monitor"]


def get_monitor(kind: str, url: str | None = None) -> Monitor:
    """The backend for `kind`; inside a `backends(monitor=...)` block (trainops.tools.backends) the
    injected provider serves every kind."""
    if (provider := injected().monitor) is not None:
        return provider(kind)
    if kind == "embedded":
        return EmbeddedMonitor()
    if kind == "prometheus":
        return PrometheusMonitor(url)
    raise MonitorError(kind, f"unknown monitor {kind!r}: use {' or '.join(get_args(MonitorKind))}")
