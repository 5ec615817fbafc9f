"""Where trainops' settings come from, and which of them can be trusted.

Three files can hold settings (TOML tables such as `[agent]` or `[governance]`):

- the user's own config: `$TRAINOPS_CONFIG`, else `$XDG_CONFIG_HOME/trainops/config.toml`
  (default `~/.config/trainops/config.toml`). Trusted: it belongs to the human.
- the workspace's `$TRAINOPS_HOME/trainops.toml`, and
- a project-local `./trainops.toml` in the current folder.

The last two can be written by anything that can use the workspace or clone a repository (an
agent with a shell, a poisoned checkout), so security settings (where approvals are verified,
which servers are contacted, which secret is sent, when changes may land: `[governance]
change_windows`, tools/governance/windows.py) are read from them only when the user's own
config lists that folder under `[trust] folders`. Dependency-free: every layer may import it.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path


class SettingsError(ValueError):
    """A settings file cannot be read: names the file and the fix."""


@dataclass(frozen=True)
class SettingsFile:
    path: Path
    trusted: bool
    tables: dict


def user_config_path() -> Path:
    explicit = os.environ.get("TRAINOPS_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "trainops" / "config.toml"


def workspace_path() -> Path:
    """`$TRAINOPS_HOME` (default `./.trainops`), resolved: where the workspace and its settings file
    lie. Declared here, the bottom, so reading settings needs no workspace; `trainops.workspace.home`
    creates the folder."""
    return Path(os.environ.get("TRAINOPS_HOME", ".trainops")).expanduser().resolve()


def read_toml(path: Path) -> dict:
    """A TOML file as a dict; any unreadable file is a SettingsError naming it, never a traceback."""
    try:
        return tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SettingsError(f"{path} is not UTF-8 text (byte {exc.start}); save it as UTF-8 or remove it") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path} is not valid TOML ({exc}); fix the file or remove it") from None
    except OSError as exc:
        raise SettingsError(f"{path} cannot be read ({exc.strerror}); fix its permissions or remove it") from None


def trusted_folders(user_tables: dict) -> list[Path]:
    folders = user_tables.get("trust", {}).get("folders", [])
    if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
        raise SettingsError(f"[trust] folders in {user_config_path()} must be a list of folder paths")
    return [Path(f).expanduser().resolve() for f in folders]


def settings_files() -> list[SettingsFile]:
    """Every settings file that exists, strongest first: project-local, workspace, user."""
    user_path = user_config_path()
    user_tables = read_toml(user_path) if user_path.is_file() else {}
    trusted = trusted_folders(user_tables)
    found = []
    for path in (Path.cwd() / "trainops.toml", workspace_path() / "trainops.toml"):
        if path.is_file() and path.resolve() != user_path.resolve():
            found.append(SettingsFile(path, path.parent.resolve() in trusted, read_toml(path)))
    if user_path.is_file():
        found.append(SettingsFile(user_path, True, user_tables))
    return found


def table(name: str, *, trusted_only: bool = False) -> tuple[dict, dict[str, str]]:
    """The `[name]` table merged over every settings file (strongest first wins), and for each key
    the file it came from. `trusted_only` skips files the user has not trusted."""
    values: dict = {}
    sources: dict[str, str] = {}
    for settings in reversed(settings_files()):
        if trusted_only and not settings.trusted:
            continue
        section = settings.tables.get(name, {})
        if not isinstance(section, dict):
            raise SettingsError(f"[{name}] in {settings.path} must be a table")
        for key, value in section.items():
            values[key] = value
            sources[key] = f"[{name}] {key} in {settings.path}"
    return values, sources


def untrusted_keys(name: str) -> dict[str, str]:
    """Keys of `[name]` set only in files the user has not trusted: key -> where it was set."""
    everything, sources = table(name)
    trusted, _ = table(name, trusted_only=True)
    return {key: sources[key] for key in everything if key not in trusted or trusted[key] != everything[key]}
