"""Shared pieces of the flag-driven adapters (torchtitan, Megatron-LM): settings from defaults
plus `section.key=value` overrides, and the run folder they launch into."""
from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

from tools.frameworks.base import FrameworkRefused, parse_value, split_override


def merged(framework: str, defaults: dict[str, dict[str, object]], overrides: list[str],
           open_sections: tuple[str, ...] = ()) -> dict[str, dict[str, object]]:
    """Defaults with overrides applied. Keys of `open_sections` pass to the framework as they are;
    elsewhere an unknown section or key is refused with the ones that exist."""
    settings = {section: dict(values) for section, values in defaults.items()}
    for item in overrides:
        key, value = split_override(item)
        section, _, name = key.partition(".")
        if section not in settings:
            raise FrameworkRefused(f"--set {key}: {framework} jobs have sections {', '.join(settings)}")
        if section not in open_sections and name not in settings[section]:
            raise FrameworkRefused(f"--set {key}: unknown key; {section} takes {', '.join(settings[section])}")
        settings[section][name] = parse_value(value)
    return settings


def new_run_dir(framework: str, settings: dict[str, dict[str, object]]) -> Path:
    """`$TRAINOPS_HOME/runs/RUN/` with config.toml (flat sections, one key per knob)."""
    from trainer.launch import runs_root

    run_dir = runs_root() / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    (run_dir / "logs").mkdir(parents=True)
    lines = [f'framework = "{framework}"', ""]
    for section, values in settings.items():
        lines.append(f"[{section}]")
        lines += [f"{json.dumps(k) if '.' in k else k} = {json.dumps(v)}" for k, v in values.items()]
        lines.append("")
    (run_dir / "config.toml").write_text("\n".join(lines), encoding="utf-8")
    return run_dir


def write_command(run_dir: Path, command: list[str]) -> None:
    """The exact command line, kept with the run for the evidence pack."""
    (run_dir / "command.json").write_text(json.dumps(command, indent=1), encoding="utf-8")


def number(match) -> float | None:
    """The first captured group of a regex match as a float ('1,234' -> 1234.0); None without a match."""
    if match is None:
        return None
    return float(next(g for g in match.groups() if g is not None).replace(",", ""))
