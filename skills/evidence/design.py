"""S3's ablation design as the pack carries it: each candidate arm ranked by expected gain, with
the baseline figure it acts on and the most it could save (Amdahl: no knob saves more step time
than the share it acts on). A contract module: it imports nothing above it;
trainops.skills.ablation_design computes it."""
from __future__ import annotations

from pydantic import BaseModel, Field


class DesignFigure(BaseModel):
    """The measured figure an arm acts on, as a share of the baseline's step time."""

    name: str = Field(description="e.g. 'exposed communication', 'data loading', 'compute'")
    value_pct: float | None = Field(ge=0, le=100, description="share of step time, percent; None: not measured")
    unit: str = Field("% of step time")
    text: str = Field(description="how the report writes it, e.g. 'exposed communication 31.0% of step time'")
    method: str = Field(description="where the figure came from, or why it was not measured")


class DesignedArm(BaseModel):
    """One candidate arm in the order S4 runs it."""

    rank: int = Field(ge=1, description="1 is the highest expected gain")
    arm: str = Field(description="NAME=VALUE, as --knob takes it")
    knob: str
    value: str
    category: str = Field(description="communication-overlap | kernels | data-pipeline | batch | memory | parallelism")
    figure: DesignFigure
    bound_pct: float | None = Field(ge=0, le=100, description="the most step time the arm could save, percent, from "
                                                              "its figure; None when the figure was not measured or "
                                                              "the arm trades speed for memory")
    reason: str = Field(description="one line: why the arm ranks where it does")
