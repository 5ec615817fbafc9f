"""Change windows (AGENTS.md R-CHG-1): the days and hours, in a named time zone, when scheduler
policy, quota and upgrade changes may land. Read from `[governance] change_windows` in the
settings files the user trusts only (an agent that can write the workspace's trainops.toml must
not open a window for itself). No window configured: changes may land at any time.

    [governance]
    change_windows = [{days = "mon-thu", hours = "10:00-16:00", tz = "Europe/Berlin"}]

`hours` may cross midnight ("22:00-02:00": the window opens on the listed day and closes the next
morning). The current time is the system clock; functions take `now` only so that `trainops rules`
and the gate judge one instant, never a value a caller can set from outside.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from trainops.settings import SettingsError, table
from trainops.tools.governance import audit, tokens

DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_HOURS = re.compile(r"^(\d{2}):(\d{2})-(\d{2}):(\d{2})$")
EXAMPLE = '{days = "mon-thu", hours = "10:00-16:00", tz = "Europe/Berlin"}'


@dataclass(frozen=True)
class ChangeWindow:
    days: frozenset[int]  # weekday numbers the window opens on (Monday 0)
    opens_min: int  # minutes after local midnight
    closes_min: int  # 1 to 1440 ("24:00"); at or before opens_min: the next day's
    tz: ZoneInfo
    text: str  # as the user wrote it: "mon-thu 10:00-16:00 Europe/Berlin"

    def _spans(self, around: datetime) -> list[tuple[datetime, datetime]]:
        """The window's (open, close) instants starting on the days around `around`, in its zone."""
        local = around.astimezone(self.tz).date()
        spans = []
        for offset in range(-1, 8):
            day = local + timedelta(days=offset)
            if day.weekday() not in self.days:
                continue
            midnight = datetime.combine(day, time(0), self.tz)  # wall-clock arithmetic in the window's zone
            closes = self.closes_min if self.closes_min > self.opens_min else self.closes_min + 24 * 60
            spans.append((midnight + timedelta(minutes=self.opens_min), midnight + timedelta(minutes=closes)))
        return spans

    def contains(self, now: datetime) -> bool:
        return any(start <= now < end for start, end in self._spans(now))

    def next_opening(self, now: datetime) -> datetime:
        return min(start for start, _ in self._spans(now) if start > now)


def _days(entry_name: str, value: object) -> frozenset[int]:
    how = f'write days as "mon-fri", "mon,wed,fri" or "sat-sun" (e.g. {EXAMPLE})'
    if not isinstance(value, str) or not value.strip():
        raise SettingsError(f"{entry_name}: days is {value!r}; {how}")
    days: set[int] = set()
    for part in value.lower().replace(" ", "").split(","):
        first, _, last = part.partition("-")
        if first not in DAY_NAMES or (last and last not in DAY_NAMES):
            raise SettingsError(f"{entry_name}: days {value!r} has {part!r}, not a day name; {how}")
        a, b = DAY_NAMES.index(first), DAY_NAMES.index(last or first)
        days.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(days)


def _hours(entry_name: str, value: object) -> tuple[int, int]:
    how = f'write hours as "HH:MM-HH:MM" in 24-hour time, e.g. "10:00-16:00" or "22:00-02:00" (e.g. {EXAMPLE})'
    match = _HOURS.match(value.strip()) if isinstance(value, str) else None
    if not match:
        raise SettingsError(f"{entry_name}: hours is {value!r}; {how}")
    h1, m1, h2, m2 = (int(g) for g in match.groups())
    if h1 > 23 or h2 > 24 or m1 > 59 or m2 > 59 or (h2 == 24 and m2):
        raise SettingsError(f"{entry_name}: hours {value!r} is not a time of day; {how}")
    opens, closes = h1 * 60 + m1, h2 * 60 + m2
    if opens == closes:
        raise SettingsError(f"{entry_name}: hours {value!r} opens and closes at the same minute; {how}")
    return opens, closes


def _zone(entry_name: str, value: object) -> ZoneInfo:
    how = 'name an IANA time zone, e.g. tz = "Europe/Berlin" or tz = "UTC"'
    if not isinstance(value, str) or not value:
        raise SettingsError(f"{entry_name}: tz is {value!r}; {how}")
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(f"{entry_name}: tz {value!r} is not a time zone this host knows; {how}") from None


def parse_windows(raw: object, where: str) -> list[ChangeWindow]:
    """`[governance] change_windows` as windows; a bad entry is a SettingsError naming it and the fix."""
    if not isinstance(raw, list):
        raise SettingsError(f"{where} must be a list of tables, e.g. change_windows = [{EXAMPLE}]")
    windows = []
    for n, entry in enumerate(raw):
        entry_name = f"{where}, entry {n + 1}"
        if not isinstance(entry, dict):
            raise SettingsError(f"{entry_name} is {entry!r}, not a table; write {EXAMPLE}")
        unknown = sorted(set(entry) - {"days", "hours", "tz"})
        if unknown:
            raise SettingsError(f"{entry_name}: unknown key {unknown[0]!r}; an entry has days, hours and tz only, "
                                f"e.g. {EXAMPLE}")
        days, (opens, closes) = _days(entry_name, entry.get("days")), _hours(entry_name, entry.get("hours"))
        tz = _zone(entry_name, entry.get("tz"))
        windows.append(ChangeWindow(days, opens, closes, tz, f"{entry['days']} {entry['hours']} {entry['tz']}"))
    return windows


def configured() -> tuple[list[ChangeWindow], str | None]:
    """The windows from the user's trusted settings and where they were set; ([], None): none set."""
    values, sources = table("governance", trusted_only=True)
    if "change_windows" not in values:
        return [], None
    where = sources["change_windows"]
    windows = parse_windows(values["change_windows"], where)
    if not windows:
        raise SettingsError(f"{where} is an empty list, which would forbid every change but emergencies; "
                            f"list at least one window ({EXAMPLE}) or remove the key")
    return windows, where


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def next_opening(windows: list[ChangeWindow], now: datetime) -> tuple[datetime, ChangeWindow]:
    return min(((w.next_opening(now), w) for w in windows), key=lambda pair: pair[0])


def describe_opening(windows: list[ChangeWindow], now: datetime) -> str:
    """'2026-12-03 10:00 Europe/Berlin (09:00 UTC, in 19 h 20 min)': the next window opening, named."""
    opening, window = next_opening(windows, now)
    wait = int((opening - now).total_seconds() // 60)
    return (f"{opening:%Y-%m-%d %H:%M} {window.tz.key} ({opening.astimezone(timezone.utc):%Y-%m-%d %H:%M} UTC, "
            f"in {wait // 60} h {wait % 60} min; window {window.text})")


def status(now: datetime | None = None) -> dict:
    """What `trainops rules` and the evidence pack show: the windows, their source, whether `now`
    is inside one, and the next opening."""
    now = now or utc_now()
    windows, where = configured()
    if not windows:
        return {"configured": False, "windows": [], "source": None, "open_now": True, "next_opening": None,
                "summary": "no change windows configured ([governance] change_windows): policy, quota and "
                           "upgrade changes may land at any time"}
    open_now = any(w.contains(now) for w in windows)
    upcoming = describe_opening(windows, now)
    return {"configured": True, "windows": [w.text for w in windows], "source": where, "open_now": open_now,
            "next_opening": upcoming,
            "summary": f"change windows {'; '.join(w.text for w in windows)} ({where}): "
                       f"{'open now' if open_now else 'closed now'}; next opening {upcoming}"}


def refusal(tool: str, emergency: bool, now: datetime | None = None) -> str | None:
    """Why `tool` may not land now, or None: inside a window, no window configured, or an emergency
    (which the token step makes cost one more approver)."""
    if emergency:
        return None
    now = now or utc_now()
    windows, where = configured()
    if not windows or any(w.contains(now) for w in windows):
        return None
    return (f"{tool} changes scheduler policy, quota or framework pins and it is outside every change window "
            f"({'; '.join(w.text for w in windows)}, {where}); the next window opens {describe_opening(windows, now)}:"
            " call it again then, or mark it emergency=true, which needs one more distinct approver")


def emergency_changes(since: float | None) -> list[dict]:
    """Every change-window call that landed as an emergency (from `since`, unix time), read from the
    audit log: its outcome entry (ok, with its input) and the humans the gate recorded as signing it."""
    entries = audit.read()
    signed = {(e.get("tool"), e.get("input_sha256")): e.get("approver") for e in entries
              if e.get("kind") == "gate" and e.get("decision") == "allowed" and e.get("approver")}
    changes = []
    for entry in entries:
        inp = entry.get("input")
        if (entry.get("kind") != "tool_call" or entry.get("ok") is not True or not isinstance(inp, dict)
                or (since is not None and entry.get("time", 0) < since)
                or not tokens.is_emergency(entry.get("tool", ""), inp)):
            continue
        target = " ".join(str(inp[k]) for k in ("tenant", "target", "framework", "to_version") if inp.get(k))
        approvers = signed.get((entry["tool"], entry.get("input_sha256")))
        changes.append({"tool": entry["tool"], "time": entry["time"], "target": target,
                        "approvers": approvers.split(", ") if approvers else [],
                        "input_sha256": entry.get("input_sha256", "")})
    return changes
