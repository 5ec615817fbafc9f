"""Tenant-facing changes that a human must approve, and per-tenant isolation of data and
checkpoints.

State lives under `$TRAINOPS_HOME/tenants/TENANT/` (framework.json, data/,
checkpoints/, runs/). The gate refuses the forbidden form (a forced cross-version framework
upgrade) before any token is looked at. `check_job_paths` is where a job's folders are confined before it launches
(or relaunches): the trainer takes its checkpoint folder and data file from its config, so the
tool layer checks them first.
"""
from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal

from pydantic import BaseModel, Field, field_validator

from trainops.run_folder import RunFiles
from trainops.settings import SettingsError, read_toml
from trainops.tools.base import InputCheck, tool
from trainops.tools.changes import compat
from trainops.tools.ids import TenantId, check_tenant_id, tenant_id_problem
from trainops.tools.schedulers.base import JobSpec
from trainops.tools.schedulers.processes import launched_spec
from trainops.trainer.config import load_config
from trainops.workspace import TENANT_ENV, confine, run_folder, scoped_tenant, shared_data_roots, tenant_area

if TYPE_CHECKING:
    from trainops.tools.frameworks.base import FrameworkAdapter
    from trainops.trainer.config import JobConfig

log = logging.getLogger(__name__)
TenantKind = Literal["data", "checkpoints", "runs"]


def tenant_ids(inp: BaseModel) -> Iterator[str]:
    """Every `tenant` an input names, in nested models too (a job spec's tenant, say)."""
    for name, value in inp:
        if name == "tenant" and value is not None:
            yield value
        elif isinstance(value, BaseModel):
            yield from tenant_ids(value)


def tenant_root(tenant: str) -> Path:
    return tenant_area(check_tenant_id(tenant))


RUN_FIELDS = ("run", "runs", "baseline", "candidate", "run_dir")
FOLDER_FIELDS = ("folder", "path", "ckpt_dir")


def _named_folder(field: str, value: str) -> Path | None:
    """The folder a run or folder field names, as the tool will resolve it (None: it names none the tool
    could read, and the tool says so itself)."""
    try:
        return run_folder(value, field) if field in RUN_FIELDS else Path(value).resolve()
    except ValueError:
        return None


def _job_problem(job_id: str, scheduler: str, tenant: str) -> str | None:
    try:
        spec = launched_spec(job_id, scheduler)  # type: ignore[arg-type]
    except (ValueError, OSError):
        spec = None
    if spec is not None and spec.tenant == tenant:
        return None
    whose = (f"tenant {spec.tenant}'s job" if spec and spec.tenant else "a job launched for no tenant" if spec
             else f"not a job trainops launched on {scheduler} in this workspace")
    return f"job_id: {job_id} is {whose}; a session scoped to tenant {tenant} ({TENANT_ENV}) reads only its own jobs"


def scope_problem(inp: BaseModel) -> str | None:
    """For a process scoped to a tenant (workspace.TENANT_ENV): the first run, folder, job or tenant the
    input names outside that tenant's own area (A-SEC-3), or None; unscoped, None."""
    try:
        tenant = scoped_tenant()
    except ValueError as exc:
        return str(exc)
    if tenant is None:
        return None
    if problem := tenant_id_problem(tenant):
        return f"{TENANT_ENV}: {problem}"
    area = tenant_area(tenant).resolve()
    for name, value in inp:
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                continue
            if name == "tenant" and item != tenant:
                return f"tenant: {item!r} is not {tenant}, the tenant this session is scoped to ({TENANT_ENV})"
            if name in RUN_FIELDS + FOLDER_FIELDS and (folder := _named_folder(name, str(item))) is not None \
                    and not folder.is_relative_to(area):
                return (f"{name}: {item} lies outside tenant {tenant}'s area ({area}); a session scoped to a tenant "
                        f"({TENANT_ENV}) reads and changes only that tenant's runs and checkpoints")
            if name == "job_id" and (problem := _job_problem(str(item), getattr(inp, "scheduler", None) or "local",
                                                            tenant)):
                return problem
    return None


def tenant_path(tenant: str, kind: TenantKind) -> Path:
    """The folder where `tenant`'s training data, checkpoints or run folders live (R-SEC-3)."""
    if kind not in ("data", "checkpoints", "runs"):
        raise ValueError(f"kind={kind!r} is not valid: use 'data', 'checkpoints' or 'runs'")
    path = tenant_root(tenant) / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_tenant_path(tenant: str, path: str | Path) -> Path:
    """Refuse a path (relative paths count from the tenant root) that resolves outside the tenant's root."""
    root = tenant_root(tenant).resolve()
    candidate = Path(path)
    resolved = (candidate if candidate.is_absolute() else root / candidate).resolve()
    if not resolved.is_relative_to(root):
        raise ValueError(f"R-SEC-3: path={str(path)!r} is outside tenant {tenant!r}'s root {root}; "
                         f"fix: keep data and checkpoints under tenant_path({tenant!r}, 'data'|'checkpoints')")
    return resolved


def check_job_paths(spec: JobSpec, config: JobConfig | None = None,
                    adapter_of: Callable[[str], FrameworkAdapter] | None = None) -> None:
    """Refuse a job whose folders or files lie outside where it may act: the workspace and the
    `[governance] roots` for everyone (shared `data_roots` for reading data); for a tenant's job,
    its workdir, run folder and checkpoint folder inside the tenant's root and its data inside
    that root or a shared data root (R-SEC-3). `config` is the trainer config the run will use
    (default: the run folder's config.toml, which the job itself can rewrite before a requeue).
    A run folder another framework made keeps its checkpoints where its adapter says:
    `adapter_of` is the adapter lookup (`trainops.tools.frameworks.get_adapter`), passed in by
    the job tools, as the trainer's own adapter builds its jobs through this check."""
    workdir = confine(spec.workdir, "spec.workdir", must_exist=True) if spec.workdir else Path.cwd()
    written = {"spec.workdir": spec.workdir and workdir}
    if spec.run_dir:
        run_dir = written["spec.run_dir"] = confine(spec.run_dir, "spec.run_dir")
        framework = _framework_of(run_dir) if config is None else "trainops"
        if framework not in (None, "trainops"):  # another framework's run: its adapter knows where checkpoints go
            if adapter_of is None:
                raise ValueError(f"spec.run_dir={str(run_dir)!r} is a {framework} run: check it with "
                                 "adapter_of=trainops.tools.frameworks.get_adapter, which knows its checkpoint folder")
            written["checkpoint.folder"] = confine(adapter_of(framework).checkpoint_dir(str(run_dir)),
                                                   "checkpoint.folder")
        elif config is None and RunFiles(run_dir).config.is_file():
            config = load_config(RunFiles(run_dir).config)
        if config is not None:
            written["checkpoint.folder"] = confine(run_dir / config.checkpoint.folder, "checkpoint.folder")
    named = {"data.path": config.data.path if config is not None and config.data.kind == "text" else None,
             "model.init_from": config.model.init_from if config is not None else None}
    read = {field: (value, confine(workdir / Path(value).expanduser(), field, reading=True))
            for field, value in named.items() if value}
    if spec.tenant is None:
        return
    root = tenant_root(spec.tenant).resolve()
    for field, path in written.items():
        if path and not path.is_relative_to(root):
            raise ValueError(f"R-SEC-3: {field}={str(path)!r} is outside tenant {spec.tenant!r}'s root {root}; "
                             f"fix: keep the job's folders under {root} (a tenant's runs go in {root / 'runs'})")
    shared = shared_data_roots()
    for field, (value, path) in read.items():
        if not any(path.is_relative_to(r) for r in [root, *shared]):
            shared_text = ", ".join(map(str, shared)) or "none"
            raise ValueError(f"R-SEC-3: {field}={value!r} resolves to {path}, outside tenant {spec.tenant!r}'s "
                             f"data {root / 'data'} and the shared data roots ({shared_text}); fix: put it in the "
                             "tenant's data folder or list a shared read-only folder under [governance] data_roots")


def _framework_of(run_dir: Path) -> str | None:
    """The framework a run folder's config.toml names (`framework = "deepspeed"` at the top, as the
    adapters write it), "trainops" for the trainer's own config, None without a readable config."""
    path = RunFiles(run_dir).config
    if not path.is_file():
        return None
    try:
        framework = read_toml(path).get("framework", "trainops")
    except SettingsError:
        return "trainops"  # let the trainer's loader name what is wrong with it
    return framework if isinstance(framework, str) else "trainops"


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    tmp.replace(path)


def _read_json(path: Path) -> dict[str, Any] | None:
    """A tenant's JSON state file; a corrupt one is a ValueError naming it, never a traceback."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not UTF-8 JSON ({exc}); restore it from the audit log or remove it") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds {type(data).__name__}, not a JSON object; restore it or remove it")
    return data


_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def _major_minor(field: str, value: str) -> tuple[int, int]:
    match = _VERSION.match(value.strip())
    if not match:
        raise ValueError(f"{field}={value!r} is not a version: write MAJOR.MINOR[.PATCH], e.g. 2.13.0")
    return int(match.group(1)), int(match.group(2))


class UpgradeInput(BaseModel):
    tenant: TenantId = Field(description="Tenant whose jobs the upgrade applies to (e.g. 'acme').")
    framework: str = Field(description="Framework name, e.g. 'torch', 'megatron-core', 'deepspeed'.")
    from_version: str = Field(description="Version pinned now.")
    to_version: str = Field(description="Version to pin.")
    force: bool = Field(False,
                        description="Skip the compatibility matrix; a forced cross-version upgrade is forbidden.")
    emergency: bool = Field(False, description="Land outside a change window; needs one more approver.")

    @field_validator("from_version", "to_version")
    @classmethod
    def _is_version(cls, value: str, info) -> str:
        _major_minor(info.field_name, value)
        return value


class UpgradeOutput(BaseModel):
    tenant: str
    framework: str
    pinned_version: str
    previous_version: str


def is_cross_version(from_version: str, to_version: str) -> bool:
    """An upgrade moves within one major version, one minor at a time (and then must land inside
    the compatibility matrix, tools/changes/compat.py)."""
    (fa, fi), (ta, ti) = _major_minor("from_version", from_version), _major_minor("to_version", to_version)
    return fa != ta or abs(ti - fi) > 1


def _no_forced_cross_version(inp: UpgradeInput) -> str | None:
    if inp.force and is_cross_version(inp.from_version, inp.to_version):
        return (f"force=True from {inp.from_version} to {inp.to_version} is a forced cross-version upgrade, on "
                "the forbidden list; upgrade one minor version at a time along the compatibility matrix")
    return None


def _follows_matrix(inp: UpgradeInput) -> str | None:
    if is_cross_version(inp.from_version, inp.to_version):
        return (f"to_version={inp.to_version!r} is not reachable from {inp.from_version} in one step of the "
                "compatibility matrix; upgrade one minor version at a time")
    try:
        pinned = _read_json(tenant_root(inp.tenant) / "framework.json") or {}
    except ValueError as exc:
        return str(exc)
    current = pinned.get(inp.framework)
    if current and current != inp.from_version:
        return f"from_version={inp.from_version!r} but {inp.framework} is pinned at {current}: start from the pin"
    return None


def tenant_pins(tenant: str) -> dict[str, str]:
    """The framework versions `upgrade_framework` pinned for `tenant` (framework.json); {} without a pin."""
    path = tenant_root(tenant) / "framework.json"
    pins = _read_json(path) or {}
    bad = [name for name, value in pins.items() if not isinstance(value, str)]
    if bad:
        raise ValueError(f"{path}: pin {bad[0]!r} is not a version string; restore it from the audit log or remove it")
    return pins


def _upgrade_in_matrix(inp: UpgradeInput) -> str | None:
    """The target with the tenant's other pins and the installed CUDA and frameworks must be a
    published combination: a torch the declared CUDA has no wheel for, or one an installed
    adapter framework's requirement excludes, is refused naming the pair."""
    try:
        versions = {**tenant_pins(inp.tenant), inp.framework: inp.to_version}
        env = compat.with_versions(compat.installed_environment(compat.PACKAGES), versions)
        problems = compat.check(env).problems
    except ValueError as exc:
        return str(exc)
    if not problems:
        return None
    return (f"{inp.framework} {inp.to_version} for tenant {inp.tenant!r} is outside the compatibility matrix: "
            f"{'; '.join(problems)}")


def check_launch_versions(spec: JobSpec) -> None:
    """Refuse a launch whose framework versions (installed, with the tenant's pins in place) form a
    pair outside the compatibility matrix, or whose installed versions differ from the tenant's pin."""
    framework = _framework_of(confine(spec.run_dir, "spec.run_dir")) if spec.run_dir else None
    pins = tenant_pins(spec.tenant) if spec.tenant else {}
    names = {compat.ADAPTER_PACKAGES.get(framework or ""), *pins} & set(compat.PACKAGES)
    installed = compat.installed_environment(tuple(sorted(names)))
    report = compat.check(compat.with_versions(installed, pins))
    problems = report.problems
    for note in report.unchecked:  # said, not passed silently: the matrix holds no data to refuse it on
        log.warning("compatibility matrix: %s", note)
    if problems:
        raise ValueError(f"the job's framework versions are outside the compatibility matrix: {'; '.join(problems)}")
    for name, pinned in sorted(pins.items()):
        running = compat.version_of(installed, name)
        if running is None or not compat.same_version(pinned, running):
            raise ValueError(f"tenant {spec.tenant!r} pins {name} {pinned} but this launch runs {name} "
                             f"{running or 'not installed (a CPU build, for cuda)'}; fix: install {name} {pinned} "
                             "where the job runs, or move the pin with upgrade_framework")


@tool("upgrade_framework", risk="irreversible", tags=("tenant-governance", "change-window"),
      checks=(InputCheck("R-SEC-2", _no_forced_cross_version, kind="forbidden"),
              InputCheck("R-SEC-2", _follows_matrix), InputCheck("R-SEC-2", _upgrade_in_matrix)))
def upgrade_framework(inp: UpgradeInput) -> UpgradeOutput:
    """Pin a newer framework version for a tenant's jobs, one compatibility-matrix step at a
    time. Irreversible for running jobs (checkpoints written by the new version may not load
    in the old one), so it needs a human approval token."""
    path = tenant_root(inp.tenant) / "framework.json"
    pinned = _read_json(path) or {}
    previous = pinned.get(inp.framework, inp.from_version)
    pinned[inp.framework] = inp.to_version
    _write_json(path, pinned)
    return UpgradeOutput(tenant=inp.tenant, framework=inp.framework, pinned_version=inp.to_version,
                         previous_version=previous)
