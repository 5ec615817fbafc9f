"""Shared pieces of the adapters: the class boilerplate every adapter repeats (`AdapterBase`),
settings from defaults plus `section.key=value` overrides, and the run folder they launch into."""
from __future__ import annotations

import json
from pathlib import Path

from trainops.run_folder import new_run_folder
from trainops.tools.frameworks.base import (
    FrameworkKnob,
    FrameworkName,
    FrameworkRefused,
    check_knob_values,
    installed_version,
    knob_table,
    parse_value,
    split_override,
)


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


class AdapterBase:
    """What every adapter shares: its version from its package, its knobs, knob values turned into
    overrides, and `RUN/checkpoints`."""

    name: FrameworkName  # which of the declared names this adapter adapts
    display_name: str
    package: str | None
    knob_list: list[FrameworkKnob]

    def version(self) -> str:
        return installed_version(self.package)

    def knobs(self) -> list[FrameworkKnob]:
        return list(self.knob_list)

    def knob_overrides(self, knob_values: dict[str, str], overrides: list[str] | None) -> list[str]:
        """Refuse unknown knobs and values, then the overrides followed by each knob's own."""
        check_knob_values(self.name, self.knob_list, knob_values)
        table = knob_table(self.knob_list)
        return [*(overrides or []), *(f"{table[n].override}={v}" for n, v in knob_values.items())]

    def checkpoint_dir(self, run_dir: str) -> str:
        return str(Path(run_dir) / "checkpoints")


class SettingsAdapter(AdapterBase):
    """An adapter whose settings are its own `defaults` with overrides applied; its own section
    (named after the framework) passes any key through to the framework."""

    defaults: dict[str, dict[str, object]]

    def settings(self, overrides: list[str]) -> dict[str, dict[str, object]]:
        return merged(self.name, self.defaults, overrides, open_sections=(self.name,))


def new_run_dir(framework: str, settings: dict[str, dict[str, object]]) -> Path:
    """A new `$TRAINOPS_HOME/runs/RUN/` (trainops.run_folder.new_run_folder) with config.toml: flat
    sections, one key per knob."""
    lines = [f'framework = "{framework}"', ""]
    for section, values in settings.items():
        lines.append(f"[{section}]")
        lines += [f"{json.dumps(k) if '.' in k else k} = {json.dumps(v)}" for k, v in values.items()]
        lines.append("")
    return new_run_folder("\n".join(lines))


def write_command(run_dir: Path, command: list[str]) -> None:
    """The exact command line, kept with the run for the evidence pack."""
    (run_dir / "command.json").write_text(json.dumps(command, indent=1), encoding="utf-8")


def number(match) -> float | None:
    """The first captured group of a regex match as a float ('1,234' -> 1234.0); None without a match."""
    if match is None:
        return None
    return float(next(g for g in match.groups() if g is not None).replace(",", ""))
