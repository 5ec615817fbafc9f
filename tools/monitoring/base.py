"""The monitoring contract: an instant value or a series for one metric of one run, per rank.

Metric names are the trainer's record names (`loss`, `step_time_s`, `mfu_pct`, ...) plus
`heartbeat_age_s` and the run-level aggregates in AGGREGATES (`mfu_pct_avg`,
`tokens_per_s_sum`, `step_time_spread_s`: slowest minus fastest rank); Prometheus names add
the `trainops_` prefix, the backend does that."""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

MonitorKind = Literal["embedded", "prometheus"]
HEARTBEAT_AGE = "heartbeat_age_s"
# run-level aggregates over ranks: name -> (record metric, how)
AGGREGATES: dict[str, tuple[str, str]] = {
    "mfu_pct_avg": ("mfu_pct", "avg"),
    "tokens_per_s_sum": ("tokens_per_s", "sum"),
    "step_time_spread_s": ("step_time_s", "spread"),
}


class MonitorError(Exception):
    """A monitoring backend failed: names the backend, the address or file, and what to do."""

    def __init__(self, backend: str, message: str):
        super().__init__(f"{backend} monitor: {message}")
        self.backend = backend


class Sample(BaseModel):
    rank: int | None = Field(None, description="The rank, or None for a value over all ranks.")
    time: float = Field(description="Unix seconds of the sample.")
    value: float
    step: int | None = None
    node: str | None = Field(None, description="The node the rank ran on, where the backend knows it (the "
                                               "heartbeat's host; Prometheus' `node` target label).")


class Series(BaseModel):
    metric: str
    run: str
    rank: int | None = None
    samples: list[Sample] = Field(default_factory=list)


@runtime_checkable
class Monitor(Protocol):
    """`run` is the run as the backend knows it: the run folder, resolved and confined by the caller
    (trainops.workspace.run_folder), for a backend that reads it (embedded); the run id, the `run`
    label of the exporters' series, for one that asks a server (Prometheus)."""

    kind: str

    def instant(self, metric: str, run: Path | str, rank: int | None = None) -> list[Sample]:
        """The latest value per rank (or of one rank)."""
        ...

    def series(self, metric: str, run: Path | str, rank: int | None = None, window_s: float = 300.0) -> list[Series]:
        """Values over the last `window_s` seconds, one series per rank."""
        ...
