"""Fault injection for drills: crash, hang, NaN loss, bit-flip, straggler, corrupt checkpoint.

Each injection appends its exact wall time to `RUN/faults.jsonl` (kind, step, rank, time)
*before* it acts, so a drill measures detection latency as (time detected - time injected).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from trainops.run_folder import RunFiles
from trainops.run_records import read_faults
from trainops.trainer.checkpoint_files import list_checkpoints
from trainops.workspace import home

CRASH_EXIT_CODE = 42
"""Exit code of an injected `crash_mode = "exit"` crash: distinct, so a drill can tell it apart."""

ONE_SHOT_KINDS = frozenset({"crash", "hang", "nan", "bitflip", "corrupt_checkpoint"})
"""Faults that fire once per run: a requeued run reads the same config, and firing again would
make every restart fail the same way. A straggler (`slow`) is a property of the node: it stays."""


class FaultSettings(Protocol):
    """The `[faults]` section as the injector reads it (trainops.trainer.config.FaultsConfig)."""
    crash_step: int | None
    crash_rank: int
    crash_mode: Literal["exit", "sigkill"]
    hang_step: int | None
    hang_rank: int
    nan_step: int | None
    bitflip_step: int | None
    bitflip_rank: int
    slow_rank: int | None
    slow_ms: int
    corrupt_checkpoint: bool


def record_fault(run_dir: str | Path, kind: str, step: int | None, rank: int, **detail: Any) -> dict:
    """Append one injection record to RUN/faults.jsonl, flushed to disk, and return it."""
    record = {"kind": kind, "step": step, "rank": rank, "time": time.time(), **detail}
    path = RunFiles(run_dir).faults
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return record


def defect_marker(host: str) -> Path:
    """Where a host's emulated hardware defect is marked: `$TRAINOPS_HOME/emulated-defects/HOST.json`."""
    return home() / "emulated-defects" / f"{host}.json"


def mark_host_defective(record: dict) -> None:
    """The bit-flip drill emulates a defective chip: its host stays marked (the fault record),
    so the known-answer check (trainops.tools.reliability.sdc_check) computes wrong on that host alone, until
    a human who replaced the part removes the marker."""
    path = defect_marker(record["host"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")


def fired_faults(run_dir: str | Path, rank: int) -> set[str]:
    """One-shot kinds the trainer's injector already fired on `rank` in this run folder (its own
    records carry a step; a drill tool's runtime injections, which have none, do not count)."""
    return {fault.kind for fault in read_faults(run_dir)
            if fault.kind in ONE_SHOT_KINDS and fault.step is not None and fault.rank == rank}


def _int_view(values: torch.Tensor) -> torch.Tensor:
    widths = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return values.view(widths[values.element_size()])


def flip_bit(param: torch.Tensor, index: int, bit: int) -> tuple[float, float]:
    """Flip bit `bit` of element `index` (flat) of a floating tensor in place; returns (old, new)."""
    flat = param.detach().view(-1)
    old = flat[index].item()
    bits = _int_view(flat[index : index + 1])
    bits ^= torch.tensor(1 << bit, dtype=torch.int64).to(bits.dtype)
    return old, flat[index].item()


def exponent_msb(dtype: torch.dtype) -> int:
    """The highest exponent bit: flipping it turns a small weight into a huge one (visible SDC)."""
    return {torch.float32: 30, torch.float64: 62, torch.bfloat16: 14, torch.float16: 14}[dtype]


def corrupt_checkpoint(path: str | Path, how: Literal["overwrite", "truncate"] = "overwrite") -> str:
    """Damage the largest data file of a checkpoint folder; returns the file's name.

    `overwrite` inverts 64 bytes in the middle (size unchanged, only the checksum can tell);
    `truncate` cuts the file in half (what a full disk or a killed writer leaves).
    """
    data_files = [p for p in Path(path).rglob("*.distcp") if p.is_file()]
    if not data_files:
        raise FileNotFoundError(f"checkpoint {path} has no .distcp data file to corrupt")
    target = max(data_files, key=lambda p: p.stat().st_size)
    size = target.stat().st_size
    if how == "truncate":
        os.truncate(target, size // 2)
    else:
        with target.open("r+b") as fh:
            fh.seek(size // 2)
            chunk = fh.read(64)
            fh.seek(size // 2)
            fh.write(bytes(b ^ 0xFF for b in chunk))
    return target.name


class FaultInjector:
    """Called by the training loop at fixed points; does nothing unless `[faults]` asks for it."""
    def __init__(self, cfg: FaultSettings, rank: int, run_dir: str | Path) -> None:
        self.cfg, self.rank, self.run_dir = cfg, rank, Path(run_dir)
        self._slow_recorded = False
        self.fired = fired_faults(self.run_dir, rank)

    def _due(self, kind: str) -> bool:
        """A one-shot fault this rank already fired in this run (before a restart) stays quiet."""
        return kind not in self.fired

    def _fire(self, kind: str, step: int | None, **detail: Any) -> dict:
        self.fired.add(kind)
        return record_fault(self.run_dir, kind, step, self.rank, **detail)

    def on_step_start(self, step: int) -> None:
        """Crash, hang or slow down this rank, as configured, before the step's work."""
        cfg = self.cfg
        if cfg.crash_step == step and cfg.crash_rank == self.rank and self._due("crash"):
            self._fire("crash", step, mode=cfg.crash_mode,
                         exit_code=CRASH_EXIT_CODE if cfg.crash_mode == "exit" else -signal.SIGKILL)
            sys.stdout.flush()
            sys.stderr.flush()
            if cfg.crash_mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            # at once, as a crash does: an orderly exit tears gloo down first (~1 s), time in which
            # the peers see the closed connections, fail, and have torchrun SIGTERM this rank
            os._exit(CRASH_EXIT_CODE)
        if (cfg.hang_step is not None and step >= cfg.hang_step and cfg.hang_rank == self.rank
                and self._due("hang")):
            self._fire("hang", step)
            while True:  # a hung rank: no progress, no heartbeat, no exit
                time.sleep(1.0)
        if cfg.slow_rank == self.rank and cfg.slow_ms > 0:
            if not self._slow_recorded:
                record_fault(self.run_dir, "slow", step, self.rank, slow_ms=cfg.slow_ms)
                self._slow_recorded = True
            time.sleep(cfg.slow_ms / 1000.0)

    def after_loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """Return the loss, or a NaN loss at `nan_step` (on every rank: the loss is global)."""
        if self.cfg.nan_step != step or not self._due("nan"):
            return loss
        self._fire("nan", step)
        return loss * float("nan")

    def after_step(self, step: int, model: torch.nn.Module) -> dict | None:
        """At `bitflip_step` on `bitflip_rank`, flip the top exponent bit of one parameter element:
        the middle element this rank holds of the first parameter outside an embedding (an
        embedding row only matters when its token occurs; a projection touches every token).
        A silent data corruption that only the loss, the grad norm or a replica check reveals."""
        if self.cfg.bitflip_step != step or self.cfg.bitflip_rank != self.rank or not self._due("bitflip"):
            return None
        for module_name, module in model.named_modules():
            if isinstance(module, torch.nn.Embedding):
                continue
            for param_name, param in module.named_parameters(recurse=False):
                local = param.to_local() if hasattr(param, "to_local") else param
                if local.numel() == 0 or not local.is_floating_point():
                    continue
                index, bit = local.numel() // 2, exponent_msb(local.dtype)
                with torch.no_grad():
                    old, new = flip_bit(local, index, bit)
                record = self._fire("bitflip", step, parameter=f"{module_name}.{param_name}".lstrip("."),
                                    index=index, bit=bit, old_value=old, new_value=new, host=socket.gethostname())
                mark_host_defective(record)
                return record
        return None

    def on_train_end(self, checkpoint_folder: str | Path) -> dict | None:
        """With `corrupt_checkpoint`, rank 0 damages the newest committed checkpoint once training
        (and every background write) has finished, so the next resume must fall back."""
        if not self.cfg.corrupt_checkpoint or self.rank != 0 or not self._due("corrupt_checkpoint"):
            return None
        return self.corrupt_latest_checkpoint(checkpoint_folder)

    def corrupt_latest_checkpoint(self, folder: str | Path) -> dict | None:
        """Corrupt the newest committed checkpoint under `folder` now, whatever the config says."""
        committed = [info for info in list_checkpoints(folder) if info.committed]
        if not committed:
            return None
        newest = committed[-1]
        record = self._fire("corrupt_checkpoint", newest.step, path=newest.path)
        return {**record, "file": corrupt_checkpoint(newest.path)}
