"""What Slurm did, compared with what was approved. `scontrol update` and `sacctmgr modify` exit 0
for settings they store otherwise than asked (measured on Slurm 22.05: `OverSubscribe=FORCE:0` is
stored as EXCLUSIVE, `PreemptMode=GANG` as OFF and `REQUEUE,GANG` as REQUEUE without gang
scheduling), so a change is judged by the state read back after it, field by field, each field in
the one form Slurm shows it: `MaxTime=60` shows as 01:00:00 and seconds round up to a minute,
`FORCE` as FORCE:4, `INFINITE` as UNLIMITED, a name list in any order. Any field that differs is a
failed change: the caller rolls it back and says so."""
from __future__ import annotations

import math
from typing import Any, Callable

from trainops.tools.base import ToolError

DEFAULT_SHARE = "4"
"""Slurm's job count for OverSubscribe=YES or FORCE given without one."""


def _minutes(text: str) -> str:
    """A Slurm time limit in whole minutes (its own input forms: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S),
    or UNLIMITED; the text as it is when it is none of those."""
    value = text.strip().upper()
    if value in ("UNLIMITED", "INFINITE", "-1"):
        return "UNLIMITED"
    days, _, rest = value.rpartition("-") if "-" in value else ("0", "", value)
    parts = rest.split(":")
    if not days.isdigit() or not all(p.isdigit() for p in parts) or len(parts) > 3:
        return text
    numbers = [int(p) for p in parts]
    if "-" in value:  # D-H, D-H:M, D-H:M:S
        hours, minutes, seconds = (numbers + [0, 0])[:3]
    else:  # M, M:S, H:M:S
        hours, minutes, seconds = {1: (0, numbers[0], 0), 2: (0, *numbers), 3: tuple(numbers)}[len(numbers)]
    return str(math.ceil((((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds) / 60))


def _oversubscribe(text: str) -> str:
    value = text.strip().upper()
    return f"{value}:{DEFAULT_SHARE}" if value in ("YES", "FORCE") else value


def _unlimited(text: str) -> str:
    value = text.strip().upper()
    return "UNLIMITED" if value in ("INFINITE", "UNLIMITED") else value


def _name_set(text: str) -> str:
    return ",".join(sorted({name for name in text.strip().split(",") if name}))


def _upper_set(text: str) -> str:
    return ",".join(sorted({part for part in text.strip().upper().split(",") if part}))


PARTITION_FORMS = {"MaxTime": _minutes, "OverSubscribe": _oversubscribe, "MaxNodes": _unlimited,
                   "PreemptMode": _upper_set, "AllowAccounts": _name_set, "AllowQos": _name_set,
                   "PriorityTier": lambda text: text.strip()}
"""Each partition setting's normal form: an approved value and the value scontrol shows compare equal
exactly when Slurm stored what was asked."""


def partition_not_applied(approved: dict[str, str], shown: dict[str, Any]) -> list[str]:
    """Each approved partition setting the partition does not show, as `KEY approved A, Slurm shows B`."""
    return [f"{key} approved {value}, Slurm shows {shown.get(key)!r}" for key, value in approved.items()
            if PARTITION_FORMS[key](str(value)) != PARTITION_FORMS[key](str(shown.get(key, "")))]


def quota_not_applied(expected: dict[str, Any], shown: dict[str, Any]) -> list[str]:
    """Each field of a tenant's account and QOS that sacctmgr does not show as the approved quota set it
    (`users` is a floor: the tenant's other users stay)."""
    problems = []
    for key, want in expected.items():
        have = shown.get(key)
        ok = set(want) <= set(have or ()) if key == "users" else have == want
        if not ok:
            problems.append(f"{key} approved {want!r}, sacctmgr shows {have!r}")
    return problems


def roll_back_failed(tool: str, change: str, subject: str, store: str, missed: list[str],
                     undo: Callable[[], list[str]]) -> ToolError:
    """The error for a change `store` stored otherwise than approved, once `undo` (which runs the
    rollback and returns what still differs from the previous state) has put it back."""
    left = undo()
    return ToolError(tool, f"{change} FAILED: {store} did not store what was approved ({'; '.join(missed)}); it was "
                           "rolled back, and " + (f"the {subject} is NOT as before: {'; '.join(left)}" if left else
                                                  f"the {subject} reads back exactly as before"))
