"""The pack's parts that read the run against published figures and the declared topology (S7,
and the parallel-strategy plan): models only, so the evidence model can hold them and
`references` can fill them without an import cycle."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from trainops.tools.planning.layout_mapping import TopologyPlan


class MlperfResult(BaseModel):
    """One published MLPerf Training result, with the round and the source it is taken from."""

    round: str = Field(description="e.g. 'MLPerf Training v4.0'")
    published: str
    benchmark: str
    submitter: str
    accelerator: str
    accelerators: int
    generation: str = Field(description="accelerator generation, e.g. Hopper")
    time_to_train_min: float
    source: str
    url: str
    level: Literal["A", "B", "C"] = Field(description="seed 004's evidence level: A the publisher's own, B a "
                                                      "restatement, C a compilation or estimate")


class MlperfComparison(BaseModel):
    """S7: the baseline against published MLPerf Training results of its hardware generation."""

    run_hardware: str = Field(description="the hardware the run used, as declared")
    generation: str | None = Field(description="its accelerator generation; None for a CPU or an unknown one")
    same_generation: list[MlperfResult] = Field(default_factory=list)
    verdict: str = Field(description="'no same-generation result' or how many there are")
    comparable: str = Field(description="what can and cannot be compared (MLPerf reports time to train, not MFU)")


class LayoutPlan(BaseModel):
    """The parallel-strategy plan: the mapping and its cross-domain verdict on the declared topology."""

    world_size: int
    nodes: int
    mesh: dict[str, int] = Field(default_factory=dict, description="degree per mesh dimension")
    valid: bool
    error: str | None = None
    topology: TopologyPlan | None = None
    topology_source: str = Field(description="where the scale-up domain and the node count come from")
