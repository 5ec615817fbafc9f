"""What to change after a CUDA out-of-memory end, in this job's own figures: the device's size, what
was free and what the step asked for (PyTorch's caching allocator prints them, in one wording up to
2.0 and another after), and the run's recipe from its config.toml (micro-batch, sequence length,
activation checkpointing), with the value to try. Both are the job's text: each figure is bounded,
and one out of bounds is left out rather than quoted."""
from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from trainops.run_folder import RunFiles, read_regular

MAX_GIB = 1 << 20  # a device of a PiB is not a device: a larger figure is garbage
MAX_DEVICE = 4096
MAX_RECIPE_INT = 1 << 30
MAX_CONFIG_BYTES = 64 << 10
_UNITS = {"B": 1 / (1 << 30), "bytes": 1 / (1 << 30), "KiB": 1 / (1 << 20), "KB": 1 / (1 << 20),
          "MiB": 1 / 1024, "MB": 1 / 1024, "GiB": 1.0, "GB": 1.0, "TiB": 1024.0, "TB": 1024.0}
_SIZE = r"([\d.]+(?:e[+-]?\d+)?) ?(bytes|[KMGT]i?B|B)\b"
_ASKED = re.compile(r"Tried to allocate " + _SIZE, re.I)
_TOTAL = re.compile(_SIZE + r" total capacity|total capacity of " + _SIZE, re.I)
_FREE = re.compile(_SIZE + r" free\b|of which " + _SIZE + r" is free", re.I)
_DEVICE = re.compile(r"\(GPU (\d+);|\bGPU (\d+) has a total capacity", re.I)
CHECKPOINTING = ("none", "selective", "full")


def _gib(match: re.Match | None) -> float | None:
    """The first size a match caught, in GiB, when it is a finite figure within bounds."""
    if match is None:
        return None
    number, unit = next((n, u) for n, u in zip(match.groups()[::2], match.groups()[1::2], strict=True) if n)
    try:
        value = float(number) * _UNITS.get(unit, _UNITS.get(unit.upper(), math.nan))
    except ValueError:
        return None
    return value if math.isfinite(value) and 0 <= value <= MAX_GIB else None


def _size(gib: float) -> str:
    return f"{gib:.2f} GiB" if gib >= 1 else f"{gib * 1024:.2f} MiB"


@dataclass(frozen=True)
class DeviceFigures:
    """What PyTorch's out-of-memory line says of the device; None where it says nothing usable."""
    device: int | None
    total_gib: float | None
    free_gib: float | None
    asked_gib: float | None

    def text(self) -> str:
        parts = [f"GPU {self.device}" if self.device is not None else "the GPU"]
        if self.total_gib is not None:
            parts.append(f"has {_size(self.total_gib)}")
        if self.free_gib is not None:
            parts.append(f"{_size(self.free_gib)} of it was free")
        if self.asked_gib is not None:
            parts.append(f"the step asked for {_size(self.asked_gib)} more")
        return "" if len(parts) == 1 else f"{parts[0]} {', '.join(parts[1:])} (PyTorch's line)"


def device_figures(line: str) -> DeviceFigures:
    device = _DEVICE.search(line)
    index = int(next(g for g in device.groups() if g)) if device else None
    return DeviceFigures(device=index if index is not None and index <= MAX_DEVICE else None,
                         total_gib=_gib(_TOTAL.search(line)), free_gib=_gib(_FREE.search(line)),
                         asked_gib=_gib(_ASKED.search(line)))


def recipe_of(run_dir: str | Path | None) -> dict[str, int | str]:
    """The run's batch recipe from its config.toml (bounded read; a value of the wrong type or out of
    bounds is left out); empty for a job with no run folder or no readable config."""
    data = read_regular(RunFiles(run_dir).config, MAX_CONFIG_BYTES) if run_dir else None
    try:
        training = tomllib.loads(data.decode()).get("training", {}) if data else {}
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return {}
    recipe: dict[str, int | str] = {}
    for key in ("micro_batch", "seq_len", "global_batch"):
        value = training.get(key) if isinstance(training, dict) else None
        if type(value) is int and 1 <= value <= MAX_RECIPE_INT:
            recipe[key] = value
    checkpointing = training.get("activation_checkpointing") if isinstance(training, dict) else None
    if checkpointing in CHECKPOINTING:
        recipe["activation_checkpointing"] = checkpointing
    return recipe


def _smaller_micro_batch(micro: int, global_batch: int | None) -> int | None:
    """The micro-batch to try: the largest one under `micro` that still divides the global batch (the
    trainer's rule), about half where that is free; None at 1."""
    candidates = [m for m in range(micro // 2, 0, -1) if global_batch is None or global_batch % m == 0]
    return candidates[0] if micro > 1 and candidates else None


def oom_next_step(line: str, recipe: dict[str, int | str], generic: str) -> str:
    """The next step for a CUDA out-of-memory end, with the device's figures and the recipe's values."""
    seen = device_figures(line).text()
    if not recipe:
        return (f"{seen}; " if seen else "") + generic
    shown = ", ".join(f"{k} {v}" for k, v in recipe.items())
    micro, seq = recipe.get("micro_batch"), recipe.get("seq_len")
    tries = []
    smaller = _smaller_micro_batch(micro, recipe.get("global_batch")) if isinstance(micro, int) else None
    if smaller:
        keep = (f" (the global batch {recipe['global_batch']} stays: accumulation grows)"
                if "global_batch" in recipe else "")
        tries.append(f"lower the micro-batch: training.micro_batch={smaller}{keep}")
    elif isinstance(seq, int) and seq > 2:
        tries.append(f"at micro_batch {micro or 1} only a shorter sequence is left to cut: training.seq_len={seq // 2}")
    if recipe.get("activation_checkpointing", "none") != "full":
        nxt = "selective" if recipe.get("activation_checkpointing", "none") == "none" else "full"
        tries.append(f"turn on activation checkpointing: training.activation_checkpointing={nxt}")
    tries.append("shard more (FSDP, tensor parallel)")
    return (f"{seen + '; ' if seen else ''}this run's recipe: {shown}. Try one of: " + "; ".join(tries)
            + ". Resubmit with one change: the same job runs out of memory at the same point")
