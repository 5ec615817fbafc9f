"""The ablation knobs as the SOP plans them: each knob is one variable of the job config, with the
category that orders the plan (communication overlap -> kernels -> data pipeline -> batch, as
in MegaScale's breakdown) and the effect we expect from it. The knobs themselves are declared
once, by each framework's adapter (the embedded trainer's in tools/frameworks/trainops_adapter.py);
this module serves them in the SOP's terms."""
from __future__ import annotations

from typing import get_args

from pydantic import BaseModel, Field

from trainops.tools.frameworks import get_adapter
from trainops.tools.frameworks.base import FrameworkKnob, KnobCategory

CATEGORY_ORDER: tuple[str, ...] = get_args(KnobCategory)


class Knob(BaseModel):
    name: str = Field(description="what the user types in --knob NAME=VALUE")
    category: KnobCategory = Field(description=f"one of {CATEGORY_ORDER}; orders the ablation plan")
    overrides: tuple[str, ...] = Field(description="config keys the knob sets together (one conceptual variable)")
    values: tuple[str, ...] = Field(description="accepted values")
    expected_effect: str = Field(description="what we expect and why")
    min_procs: int = Field(1, description="processes the knob needs to mean anything")

    @classmethod
    def of(cls, knob: FrameworkKnob) -> Knob:
        """An adapter's knob in the SOP's terms; the effect names the framework's own flag where that
        is not the key the knob sets (the embedded trainer's knobs are its config keys)."""
        effect = knob.expected_effect if knob.flag == knob.override else f"{knob.flag}: {knob.expected_effect}"
        return cls(name=knob.name, category=knob.category, overrides=(knob.override,), values=knob.values,
                   expected_effect=effect, min_procs=knob.min_procs)


class KnobError(ValueError):
    """An arm the SOP refuses: unknown knob, bad value, or more than one variable."""


def catalogue(framework: str = "trainops") -> dict[str, Knob]:
    """The knobs of a framework, from its adapter, by name in the adapter's order."""
    return {k.name: Knob.of(k) for k in get_adapter(framework).knobs()}


CATALOGUE: dict[str, Knob] = catalogue("trainops")  # the embedded trainer's knobs


def parse_arm(specs: list[str], framework: str = "trainops") -> tuple[Knob, str]:
    """`["NAME=VALUE"]` -> the knob and its value; exactly one variable per arm."""
    if len(specs) != 1:
        raise KnobError(
            f"knob: an arm changes exactly one variable, got {len(specs)} ({', '.join(specs) or 'none'}); "
            "run one arm per --knob, e.g. --knob data_kind=synthetic")
    name, sep, value = specs[0].partition("=")
    if not sep or not value:
        raise KnobError(f"knob: {specs[0]!r} is not NAME=VALUE; e.g. --knob micro_batch=8")
    known = catalogue(framework)
    if name not in known:
        raise KnobError(f"knob: unknown knob {name!r} for {framework}; known knobs: {', '.join(known)} "
                        f"(trainops ablate --framework {framework} --list)")
    knob = known[name]
    if value not in knob.values:
        raise KnobError(f"knob: {name}={value!r} is not accepted; use one of {', '.join(knob.values)}")
    return knob, value


def overrides_for(knob: Knob, value: str) -> list[str]:
    """The `section.key=value` overrides that apply the knob."""
    return [f"{key}={value}" for key in knob.overrides]


def plan_order(knobs: list[Knob]) -> list[Knob]:
    """The category order, the plan before a baseline is measured; with S2's summary at hand
    skills.ablation_design ranks the arms by the measured split instead."""
    return sorted(knobs, key=lambda k: CATEGORY_ORDER.index(k.category))
