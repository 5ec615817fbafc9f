"""Where trainops keeps its state: `$TRAINOPS_HOME` (default `./.trainops`), and the one check
that keeps every tool inside it.

Every folder is created on first use, so a fresh checkout needs no set-up step. `confine` is how
a tool accepts a path: resolved (symlinks included) inside the workspace or a root the user's
own config lists under `[governance] roots`, so a poisoned run folder or an over-obedient agent
cannot point a tool at the rest of the machine. `run_folder` is the one way a run id becomes a
folder; what lies in a run folder is trainops/run_folder.py, and how to read it trainops/run_records.py.
"""
from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

from trainops.settings import SettingsError, table, user_config_path, workspace_path

_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def is_valid_id(value: object) -> bool:
    return isinstance(value, str) and _SAFE_ID.fullmatch(value) is not None


PRIVATE_UMASK = 0o077  # files 0600, folders 0700: the queue, the audit log and transcripts are the user's alone


def _private_folder(path: Path) -> Path:
    """`path` created 0700 (whatever the umask) when missing; an existing folder is left as it is
    (`exposed_workspace` reports one that others can read)."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(path, 0o700)
    return path


def home() -> Path:
    return _private_folder(workspace_path())


def _sub(name: str) -> Path:
    return _private_folder(home() / name)


def exposed_workspace() -> str | None:
    """A warning when other users can enter the workspace folder; None when it is private (then
    nothing inside can be reached by them, whatever its own mode) or not created yet."""
    root = workspace_path()
    try:
        mode = root.stat().st_mode
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return (f"warning: the workspace {root} is {stat.filemode(mode)}: other users can read the approval queue, "
            f"the audit log and transcripts in it. Fix: chmod -R go-rwx {root}")


def runs_dir() -> Path:
    return _sub("runs")


def packs_dir() -> Path:
    return _sub("packs")


def jobs_dir() -> Path:
    return _sub("jobs")


def audit_log_path() -> Path:
    return home() / "audit.jsonl"


def agent_db_path() -> Path:
    return home() / "agent.sqlite"


_WORKSPACE_ID = re.compile(r"[0-9a-f]{32}")


def workspace_id() -> str:
    """This workspace's random id, made once (`workspace.id`): every signed approval, anchor and
    receipt names it, so what was signed for one workspace opens nothing in another."""
    path = home() / "workspace.id"
    if not path.exists():
        tmp = path.with_name(f".workspace.id.{os.getpid()}.{secrets.token_hex(4)}")
        tmp.write_text(secrets.token_hex(16) + "\n")
        try:
            os.link(tmp, path)  # atomic create-if-absent: two first runs agree on one id
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    value = path.read_text(encoding="utf-8", errors="replace").strip()
    if not _WORKSPACE_ID.fullmatch(value):
        raise ValueError(f"{path} holds {value[:40]!r}, not a workspace id (32 hex digits): it was edited; "
                         "restore it from a backup (approvals signed here name the original id)")
    return value


def check_id(kind: str, value: str) -> str:
    """Ids become folder names: refuse anything that could escape the workspace."""
    if not is_valid_id(value):
        raise ValueError(
            f"{kind} id {value!r} is not valid: use letters, digits, '_', '.', '-' "
            "(at most 128 characters, not starting with a dot)"
        )
    return value


def _configured_roots(key: str) -> list[Path]:
    """Folders listed under `[governance] KEY` in settings files the user trusts (never a
    project-local or workspace file the user has not trusted)."""
    values, sources = table("governance", trusted_only=True)
    roots = values.get(key, [])
    if not isinstance(roots, list) or not all(isinstance(r, str) and Path(r).expanduser().is_absolute() for r in roots):
        raise SettingsError(f"{sources.get(key, f'[governance] {key}')} must be a list of absolute folder paths, "
                            f'e.g. {key} = ["/data/shared"] (got {roots!r})')
    return [Path(r).expanduser().resolve() for r in roots]


def shared_data_roots() -> list[Path]:
    """Read-only data every job may read (`[governance] data_roots`), whatever its tenant."""
    return _configured_roots("data_roots")


def allowed_roots(*, reading: bool = False) -> list[Path]:
    """Where tools may act: the workspace and `[governance] roots`; for reading, also the shared
    data roots."""
    roots = [home(), *_configured_roots("roots")]
    return roots + shared_data_roots() if reading else roots


def confine(path: str | Path, field: str, *, reading: bool = False, must_exist: bool = False) -> Path:
    """`path` resolved (symlinks followed, relative to the current folder) when it lies inside an
    allowed root; otherwise a ValueError naming the field, the resolved target and the fix."""
    try:
        resolved = Path(path).expanduser().resolve(strict=must_exist)
    except FileNotFoundError:
        raise ValueError(f"{field}={str(path)!r} does not exist; pass an existing path") from None
    except (OSError, RuntimeError) as exc:
        raise ValueError(f"{field}={str(path)!r} cannot be resolved ({exc}); pass a plain path") from None
    roots = allowed_roots(reading=reading)
    if any(resolved.is_relative_to(root) for root in roots) and (hop := _link_out(path, roots)) is None:
        return resolved

    if any(resolved.is_relative_to(root) for root in roots):
        raise ValueError(f"{field}={str(path)!r} passes through the link {hop[0]} -> {hop[1]}, outside the workspace "
                         f"and the configured roots; fix: replace the link with a real folder inside the workspace")

    raise ValueError(
        f"{field}={str(path)!r} resolves to {resolved}, outside the workspace {home()} and the configured roots "
        f"({', '.join(str(r) for r in roots[1:]) or 'none'}); fix: use a path inside the workspace, or list its "
        f"folder under [governance] {'data_roots' if reading else 'roots'} in {user_config_path()}"
    )


def _link_out(path: str | Path, roots: list[Path]) -> tuple[Path, Path] | None:
    """The first symlink on the way to `path` that lies inside a root but points outside every root
    (a hop out and back in is still a hop out); None when there is none. Links above the roots (a
    /tmp that is itself a link) are the roots' own business."""
    current = Path(path).expanduser().absolute()
    for prefix in [*reversed(current.parents), current]:
        if not prefix.is_symlink():
            continue
        try:
            parent, target = prefix.parent.resolve(), prefix.resolve()
        except (OSError, RuntimeError):
            return prefix, Path(os.readlink(prefix))
        inside = any(parent.is_relative_to(root) for root in roots)
        if inside and not any(target.is_relative_to(root) for root in roots):
            return prefix, target
    return None


TENANT_ENV = "TRAINOPS_TENANT"
"""Scopes a process (a tenant's shell or agent session) to one tenant: its tools read and change only
that tenant's runs, checkpoints and jobs (the gate's R-SEC-3), and a bare run id names its own run."""


def scoped_tenant() -> str | None:
    """The tenant this process is scoped to, or None (the operator's whole workspace)."""
    tenant = os.environ.get(TENANT_ENV)
    if tenant is None:
        return None
    if not is_valid_id(tenant):
        raise ValueError(f"{TENANT_ENV}={tenant!r} is not a tenant id (a letter or digit, then letters, digits, "
                         "_ . -): set it to the tenant's id, or unset it for the whole workspace")
    return tenant


def tenant_area(tenant: str) -> Path:
    """The folder that holds everything of `tenant`'s (data, checkpoints, runs)."""
    return home() / "tenants" / tenant


def _run_ids_dir() -> Path:
    """Where a bare run id is looked up: the scoped tenant's runs, else the workspace's."""
    tenant = scoped_tenant()
    return tenant_area(tenant) / "runs" if tenant else runs_dir()


def run_folder(run: str, field: str = "run") -> Path:
    """A run id (under `runs/`, or the scoped tenant's runs), or a run folder path, resolved and confined
    (see `confine`)."""
    if _SAFE_ID.fullmatch(run):
        ids = _run_ids_dir()
        if (ids / run).is_dir():
            return confine(ids / run, field)
        if not Path(run).is_dir():
            recent = sorted(p.name for p in ids.iterdir() if p.is_dir())[-5:] if ids.is_dir() else []
            raise ValueError(f"{field}: run {run!r} not found in {ids}; "
                             f"recent runs: {', '.join(recent) or 'none'}")
    folder = confine(run, field)
    if not folder.is_dir():
        raise ValueError(f"{field}={run!r} is neither a run id in {runs_dir()} nor a run folder; "
                         "pass a run id or the folder a submit returned")
    return folder
