"""Training metrics behind one protocol: `embedded` (the run's own files) and `prometheus`."""
from trainops.tools.monitoring.base import Monitor, MonitorError, Sample, Series, get_monitor

__all__ = ["Monitor", "MonitorError", "Sample", "Series", "get_monitor"]
