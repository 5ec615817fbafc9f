"""Framework adapters: run the SOP on jobs written for DeepSpeed, torchtitan, Megatron-LM or
the embedded trainer. Each adapter maps the framework's own flags to trainops' knobs, refuses
flag combinations the framework forbids before launch, builds a scheduler-neutral `JobSpec`,
and parses the framework's step log lines into trainops' step metrics.

`get_adapter(name)` is the one way to pick an adapter; it lives here, above the adapters, which
import only the contract (`base`) and their shared pieces (`adapter_base`)."""
from __future__ import annotations

from trainops.tools.frameworks.base import FrameworkAdapter, FrameworkRefused, known_frameworks
from trainops.tools.frameworks.deepspeed_adapter import DeepSpeedAdapter
from trainops.tools.frameworks.megatron_adapter import MegatronAdapter
from trainops.tools.frameworks.torchtitan_adapter import TorchtitanAdapter
from trainops.tools.frameworks.trainops_adapter import TrainopsAdapter


def get_adapter(name: str) -> FrameworkAdapter:
    """The adapter for `name` (each adapter class says which FrameworkName it adapts); an unknown
    name is refused with the known ones listed."""
    adapters = {cls.name: cls for cls in (TrainopsAdapter, DeepSpeedAdapter, TorchtitanAdapter, MegatronAdapter)}
    if name not in adapters:
        raise FrameworkRefused(f"framework: unknown framework {name!r}; use one of {', '.join(known_frameworks())}")
    return adapters[name]()
