"""The versions a piece of evidence was produced with: trainops' (and its git commit when it runs
from a checkout), torch's and the scheduler's. The pack carries them, and every tool output as it
leaves trainops (`envelope`: the CLI's `tool call`, the agent's tools), so a figure read later can
be tied to the code that made it.

Read once per process and scheduler, without importing torch: from the installed distributions'
metadata. An installed wheel has no `.git` beside it, so its commit is None; nothing here fails."""
from __future__ import annotations

import subprocess
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field


class SoftwareVersions(BaseModel):
    trainops: str = Field(description="trainops' installed version")
    trainops_commit: str | None = Field(description="the git commit trainops runs from; None from an installed "
                                                    "wheel or without git")
    trainops_modified: bool | None = Field(description="the checkout has uncommitted changes to tracked files; "
                                                       "None without a commit")
    torch: str | None = Field(description="torch's installed version; None when torch is not installed")
    scheduler: str = Field(description="the scheduler and its version, as far as it can be read cheaply")


def source_root() -> Path:
    """The folder above `tools/`: the repository in a checkout, the installed `trainops` package in a wheel."""
    return Path(__file__).resolve().parent.parent


def _installed(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _run(cmd: list[str]) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None


def _git(root: Path, *args: str) -> subprocess.CompletedProcess | None:
    return _run(["git", "-C", str(root), *args])


def _commit(root: Path) -> tuple[str | None, bool | None]:
    if not (root / ".git").exists():
        return None, None
    head = _git(root, "rev-parse", "HEAD")
    if head is None or head.returncode != 0:
        return None, None
    diff = _git(root, "diff", "--quiet", "HEAD", "--")
    return head.stdout.strip(), None if diff is None else diff.returncode == 1


def scheduler_version(kind: str) -> str:
    """'local (trainops X, torchrun)', Slurm's `sinfo -V`, or what could not be read and why."""
    if kind == "local":
        return f"local (trainops {_installed('trainops')}, torchrun)"
    if kind == "slurm":
        done = _run(["sinfo", "-V"])
        if done is not None and done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
        return "slurm (version not read: sinfo -V failed)"
    return f"{kind} (version in declare_environment: not read per call)"


@lru_cache(maxsize=8)
def current(scheduler: str = "local") -> SoftwareVersions:
    """The versions this process runs with, for `scheduler` (a kind: local, slurm, kubernetes)."""
    commit, modified = _commit(source_root())
    return SoftwareVersions(trainops=_installed("trainops") or "unknown", trainops_commit=commit,
                            trainops_modified=modified, torch=_installed("torch"),
                            scheduler=scheduler_version(scheduler))


def envelope(out: BaseModel, inp: BaseModel | dict[str, Any] | None = None) -> dict[str, Any]:
    """A tool's output as it leaves trainops: its fields and `versions`, for the scheduler its input
    names (the local one when it names none)."""
    scheduler = (inp.get("scheduler") if isinstance(inp, dict) else getattr(inp, "scheduler", None)) or "local"
    return {**out.model_dump(mode="json"), "versions": current(str(scheduler)).model_dump(mode="json")}
