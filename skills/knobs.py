"""The ablation knob catalogue: each knob is one variable of the job config, with the
category that orders the plan (communication overlap -> kernels -> data pipeline -> batch, as
in MegaScale's breakdown) and the effect we expect from it."""
from __future__ import annotations

from pydantic import BaseModel, Field

CATEGORY_ORDER = ("communication-overlap", "kernels", "data-pipeline", "batch", "memory", "parallelism")


class Knob(BaseModel):
    name: str = Field(description="what the user types in --knob NAME=VALUE")
    category: str = Field(description=f"one of {CATEGORY_ORDER}; orders the ablation plan")
    overrides: tuple[str, ...] = Field(description="config keys the knob sets together (one conceptual variable)")
    values: tuple[str, ...] = Field(description="accepted values")
    expected_effect: str = Field(description="what we expect and why")
    min_procs: int = Field(1, description="processes the knob needs to mean anything")


CATALOGUE: dict[str, Knob] = {k.name: k for k in (
    Knob(name="reshard_after_forward", category="communication-overlap", overrides=("parallel.reshard_after_forward",),
         values=("true", "false"),
         expected_effect="false keeps gathered FSDP parameters for backward (ZeRO-2): one all-gather fewer per layer, "
                         "more memory"),
    Knob(name="comm_overlap", category="communication-overlap", overrides=("parallel.comm_overlap",),
         values=("true", "false"),
         expected_effect="overlaps TP collectives with the GEMMs (async TP); MegaScale's largest single gain (needs tp "
                         "> 1)",
         min_procs=2),
    Knob(name="data_parallel", category="communication-overlap", overrides=("parallel.data_parallel",),
         values=("fsdp", "ddp"),
         expected_effect="ddp replicates weights and overlaps bucketed all-reduce with backward; faster for small "
                         "models, more memory"),
    Knob(name="cpu_collectives", category="communication-overlap", overrides=("parallel.cpu_collectives",),
         values=("auto", "gloo", "shared_memory"),
         expected_effect="on one CPU host, shared memory instead of gloo's TCP for the data-parallel collectives: "
                         "a 12 MB reduce-scatter 14 -> 3 ms, ~4% of a step at the issue-17 shape",
         min_procs=2),
    Knob(name="compile", category="kernels", overrides=("training.compile",), values=("true", "false"),
         expected_effect="torch.compile fuses elementwise kernels per block (~4% of a CPU step, more on GPUs); "
                         "compile time dominates short runs, so the default, auto, compiles runs of 1000+ steps"),
    Knob(name="precision", category="kernels", overrides=("training.precision",), values=("fp32", "bf16"),
         expected_effect="bf16 halves bytes moved and uses tensor cores on GPUs; on CPUs often slower without AMX"),
    Knob(name="data_kind", category="data-pipeline", overrides=("data.kind",), values=("text", "synthetic"),
         expected_effect="synthetic tokens skip reading and tokenising: the gain bounds what a faster data pipeline "
                         "can give"),
    Knob(name="micro_batch", category="batch", overrides=("training.micro_batch",), values=("1", "2", "4", "8"),
         expected_effect="larger micro-batches raise arithmetic intensity and cut accumulation steps; costs activation "
                         "memory"),
    Knob(name="activation_checkpointing", category="memory", overrides=("training.activation_checkpointing",),
         values=("none", "selective", "full"),
         expected_effect="recomputes activations in backward: saves memory, costs ~1/3 more compute for full"),
    Knob(name="pp_schedule", category="parallelism", overrides=("parallel.pp_schedule",),
         values=("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble"),
         expected_effect="1F1B and zero-bubble schedules shrink the pipeline bubble against GPipe (needs pp > 1)",
         min_procs=2),
    Knob(name="tp", category="parallelism", overrides=("parallel.tp",), values=("1", "2"),
         expected_effect="tensor parallel degree N: splits each GEMM, adds two collectives per block; keep it inside "
                         "one scale-up domain",
         min_procs=2),
    Knob(name="sequence_parallel", category="parallelism", overrides=("parallel.sequence_parallel",),
         values=("true", "false"),
         expected_effect="with tp > 1, shards norms along the sequence: less activation memory, "
                         "reduce-scatter/all-gather instead of all-reduce",
         min_procs=2),
)}


class KnobError(ValueError):
    """An arm the SOP refuses: unknown knob, bad value, or more than one variable."""


def catalogue(framework: str = "trainops") -> dict[str, Knob]:
    """The knobs of a framework: this catalogue for the embedded trainer, the adapter's flags otherwise."""
    if framework == "trainops":
        return CATALOGUE
    from trainops.tools.frameworks import get_adapter

    return {k.name: Knob(name=k.name, category=k.category, overrides=(k.override,), values=k.values,
                         expected_effect=f"{k.flag}: {k.expected_effect}", min_procs=k.min_procs)
            for k in get_adapter(framework).knobs()}


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
    """The ablation plan, highest expected gain first."""
    return sorted(knobs, key=lambda k: CATEGORY_ORDER.index(k.category))
