"""The compatibility matrix (torch <-> CUDA <-> NCCL, DeepSpeed / megatron-core / torchtitan against torch),
shipped as package data in compat_matrix.json, and the check a launch and an upgrade run
against it. Each row names its source; a version the matrix does not list is reported as not
in it, never passed: a pair nobody published is a launch that fails on the cluster, not here.
"""
from __future__ import annotations

import json
import re
from importlib import metadata, resources, util
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

ADAPTER_PACKAGES = {"deepspeed": "deepspeed", "megatron": "megatron-core", "torchtitan": "torchtitan"}
PACKAGES = ("deepspeed", "megatron-core", "torchtitan")


class TorchRow(BaseModel):
    torch: str = Field(description="torch release series, MAJOR.MINOR.")
    cuda: list[str] | None = Field(description="CUDA versions PyTorch publishes wheels of this release for; None: "
                                               "not recorded (a CUDA build of it is reported unchecked).")
    no_cuda_below: str | None = Field(None, description="With cuda None: no build older than this CUDA exists.")
    cpu: bool = Field(description="Whether a CPU wheel is published.")
    source: str = Field(min_length=1)


class FrameworkRow(BaseModel):
    framework: Literal["deepspeed", "megatron-core", "torchtitan"]
    version: str = Field(description="The release (or MAJOR.MINOR series) the row covers.")
    min_torch: str
    max_torch: str | None = Field(None, description="First torch version it does not support, if declared.")
    source: str = Field(min_length=1)


class NcclRow(BaseModel):
    """The NCCL a torch release's CUDA wheel pins (Requires-Dist nvidia-nccl-cuMAJOR==VERSION): the
    torch, CUDA and NCCL versions that were published together."""

    torch: str = Field(description="torch release series, MAJOR.MINOR.")
    cuda: str = Field(description="The CUDA (MAJOR.MINOR) of that wheel.")
    nccl: str = Field(description="The NCCL version the wheel pins.")
    source: str = Field(min_length=1)


class Matrix(BaseModel):
    schema_version: Literal[1]
    notes: list[str] = []
    torch: list[TorchRow]
    nccl: list[NcclRow] = []
    frameworks: list[FrameworkRow]


class Environment(BaseModel):
    """Versions a job runs with; cuda None is a CPU build."""

    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    frameworks: dict[str, str] = {}


class Report(BaseModel):
    problems: list[str] = Field(description="Each incompatible pair or unknown version, named.")
    unchecked: list[str] = Field(description="What the matrix holds no data on, said rather than passed.")


def _parts(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def _in_series(version: str, series: str) -> bool:
    want = _parts(series)
    return _parts(version)[:len(want)] == want


def matrix_path() -> Path:
    return Path(str(resources.files("trainops.tools.changes").joinpath("compat_matrix.json")))


def load_matrix(path: Path | None = None) -> Matrix:
    """The shipped matrix (or `path`); bad data is one ValueError naming the file and the field."""
    path = path or matrix_path()
    try:
        return Matrix.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"compatibility matrix {path} cannot be read ({exc}); reinstall trainops") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"compatibility matrix {path}: field {field}: {first['msg']}; fix that entry") from None


def check(env: Environment, matrix: Matrix | None = None) -> Report:
    """Every pair in `env` outside the matrix, named with what the matrix does list and its source."""
    matrix = matrix or load_matrix()
    problems, unchecked = [], []
    row = next((r for r in matrix.torch if env.torch and _in_series(env.torch, r.torch)), None)
    if env.torch and row is None:
        problems.append(f"torch {env.torch}: not in the matrix (it lists torch "
                        f"{', '.join(r.torch for r in matrix.torch)}); fix: use a listed release or add a row "
                        "with its source")
    elif row is not None:
        problem = _cuda_problem(row, env)
        if problem:
            problems.append(problem)
        elif env.cuda and row.cuda is None:
            unchecked.append(f"torch {env.torch} with CUDA {env.cuda}: the matrix records no CUDA builds of torch "
                             f"{row.torch}, not checked")
    if env.nccl:
        problem, note = _nccl_problem(matrix, env)
        problems += [problem] if problem else []
        unchecked += [note] if note else []
    for name, version in sorted(env.frameworks.items()):
        problem = _framework_problem(matrix, name, version, env.torch)
        if problem:
            problems.append(problem)
    return Report(problems=problems, unchecked=unchecked)


def _cuda_problem(row: TorchRow, env: Environment) -> str | None:
    build = f"CUDA {env.cuda}" if env.cuda else "the CPU build"
    if row.cuda is None:
        ships = f"no CUDA build older than {row.no_cuda_below}" if row.no_cuda_below else "CUDA builds not recorded"
        published = not env.cuda or not row.no_cuda_below or _parts(env.cuda) >= _parts(row.no_cuda_below)
    else:
        ships = f"CUDA {'/'.join(row.cuda)}" if row.cuda else "no CUDA build"
        published = not env.cuda or any(_in_series(env.cuda, c) for c in row.cuda)
    ships += " and a CPU build" if row.cpu else ""
    if published and (env.cuda or row.cpu):
        return None
    return (f"torch {env.torch} with {build}: not a published pair; torch {row.torch} ships {ships} "
            f"(source {row.source})")


def _nccl_problem(matrix: Matrix, env: Environment) -> tuple[str | None, str | None]:
    """(problem, unchecked note) for the declared NCCL against the exact pin of this torch's CUDA
    wheel: NVIDIA publishes NCCL for several CUDA versions, so only the published triple is checked."""
    if not env.torch or not env.cuda:
        return None, f"NCCL {env.nccl}: no torch CUDA build declared to check it against, not checked"
    row = next((r for r in matrix.nccl if _in_series(env.torch, r.torch) and _in_series(env.cuda, r.cuda)), None)
    if row is None:
        return None, (f"NCCL {env.nccl} with torch {env.torch} and CUDA {env.cuda}: the matrix records no NCCL pin "
                      "for that wheel, not checked")
    if same_version(row.nccl, env.nccl):
        return None, None
    return (f"NCCL {env.nccl} with torch {env.torch} and CUDA {env.cuda}: not a published pair; torch {row.torch}'s "
            f"CUDA {row.cuda} wheel pins NCCL {row.nccl} (source {row.source})"), None


def _framework_problem(matrix: Matrix, name: str, version: str, torch: str | None) -> str | None:
    row = next((r for r in matrix.frameworks if r.framework == name and _in_series(version, r.version)), None)
    if row is None:
        listed = ", ".join(r.version for r in matrix.frameworks if r.framework == name) or "none"
        return f"{name} {version}: not in the matrix (it lists {name} {listed}); fix: use a listed release"
    if torch is None:
        return f"{name} {version} with no torch declared: it needs torch>={row.min_torch} (source {row.source})"
    if _parts(torch) < _parts(row.min_torch) or (row.max_torch and _parts(torch) >= _parts(row.max_torch)):
        bound = f"torch>={row.min_torch}" + (f",<{row.max_torch}" if row.max_torch else "")
        return f"{name} {version} with torch {torch}: not a published pair; {name} {version} needs {bound} " \
               f"(source {row.source})"
    return None


def _torch_cuda() -> str | None:
    """torch's CUDA build from torch/version.py, read without importing torch (the CLI stays fast)."""
    spec = util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text(encoding="utf-8")
    match = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return match.group(1) if match else None


def _installed(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def installed_environment(frameworks: tuple[str, ...] = ()) -> Environment:
    """What a job launched from here runs with: the versions `declare_environment` reports
    (torch, its CUDA build, the NCCL wheel) and the named framework packages that are installed."""
    nccl = _installed("nvidia-nccl-cu12") or _installed("nvidia-nccl-cu13")
    found = {name: v for name in frameworks if (v := _installed(name))}
    return Environment(torch=_installed("torch"), cuda=_torch_cuda(), nccl=nccl, frameworks=found)


def version_of(env: Environment, name: str) -> str | None:
    return {"torch": env.torch, "cuda": env.cuda, "nccl": env.nccl}.get(name, env.frameworks.get(name))


def with_versions(env: Environment, versions: dict[str, str]) -> Environment:
    """`env` with `versions` (pins, an upgrade's target) in place of what it had."""
    core = {k: v for k, v in versions.items() if k in ("torch", "cuda", "nccl")}
    frameworks = {**env.frameworks, **{k: v for k, v in versions.items() if k not in core}}
    return env.model_copy(update={**core, "frameworks": frameworks})


def same_version(a: str, b: str) -> bool:
    return _parts(a) == _parts(b)
