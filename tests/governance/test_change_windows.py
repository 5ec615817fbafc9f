"""Issue 26 item 5, rule R-CHG-1: policy, quota and upgrade changes land only inside a change window
from the user's trusted config, or as an emergency signed by one more approver than their class.
Every window here is computed around the real current time (no clock the caller can set), and the
calls go through the CLI: `trainops tool call`, `trainops approve`, `trainops rules`."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from typer.testing import CliRunner

from tests.conftest import Approver, make_ssh_key
from tests.skills import conftest as factories
from trainops.cli import app
from trainops.skills.evidence.pack import assemble, write
from trainops.skills.evidence.render import to_markdown
from trainops.tools.catalog import tool_registry
from trainops.tools.governance import queue
from trainops.workspace import runs_dir

runner = CliRunner()
UPGRADE = {"tenant": "acme", "framework": "torch", "from_version": "2.12.0", "to_version": "2.13.0"}
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


@pytest.fixture
def carol(approvers) -> Approver:
    """A third approver in the allowed-signers file: an emergency change of a two-approver class needs three."""
    key = make_ssh_key(approvers.allowed_signers.parent.parent / "keys", "carol")
    with approvers.allowed_signers.open("a") as signers:
        signers.write(f"carol {' '.join(key.with_suffix('.pub').read_text().split()[:2])}\n")
    return Approver("carol", key)


def _windows(config, *entries: str) -> None:
    """`[governance] change_windows` in the user's own config (the trusted file $TRAINOPS_CONFIG names)."""
    config.write_text(config.read_text() + f"change_windows = [{', '.join(entries)}]\n")


def _hours_around_now(start_offset_h: int, end_offset_h: int) -> tuple[str, datetime]:
    """An every-day UTC window from the current hour plus `start_offset_h` to plus `end_offset_h`, and its
    next opening after now."""
    now = datetime.now(timezone.utc)
    start, end = (now.hour + start_offset_h) % 24, (now.hour + end_offset_h) % 24
    opening = now.replace(hour=start, minute=0, second=0, microsecond=0)
    if opening <= now:
        opening += timedelta(days=1)
    return f'{{days = "mon-sun", hours = "{start:02d}:00-{end:02d}:00", tz = "UTC"}}', opening


def _tool_call(inp: dict, token: str | None = None):
    args = ["tool", "call", "upgrade_framework", "--input", json.dumps(inp), "--json"]
    return runner.invoke(app, args + (["--approval-token", token] if token else []))


def _approve(pending: str, approver: Approver, cosign: str | None = None) -> dict:
    args = ["approve", "--pending", pending, "--key", str(approver.key), "--json"]
    result = runner.invoke(app, args + (["--cosign", cosign] if cosign else []))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _pending_id(result) -> str:
    assert result.exit_code != 0
    error = json.loads(result.stdout)["error"]
    assert "refused (missing_token" in error, error
    return error.split("queued as pending approval ")[1].split(" ")[0]


@pytest.mark.rule("R-CHG-1", case="violation")
def test_an_upgrade_outside_every_window_is_refused_before_it_is_queued_naming_the_next_opening(approvers):
    window, opening = _hours_around_now(2, 3)
    _windows(approvers.config, window)
    result = _tool_call(UPGRADE)
    assert result.exit_code != 0
    error = json.loads(result.stdout)["error"]
    assert "refused (outside_change_window, R-CHG-1)" in error
    assert f"the next window opens {opening:%Y-%m-%d %H:%M} UTC" in error and "emergency=true" in error
    assert queue.pending_calls() == []  # nobody is asked to sign a call that could not land


@pytest.mark.rule("R-CHG-1", case="violation")
def test_a_window_on_other_days_in_its_own_time_zone_names_that_days_opening(approvers):
    berlin = ZoneInfo("Europe/Berlin")
    later = datetime.now(berlin).date() + timedelta(days=2)
    _windows(approvers.config, f'{{days = "{DAYS[later.weekday()]}", hours = "00:00-24:00", tz = "Europe/Berlin"}}')
    error = json.loads(_tool_call(UPGRADE).stdout)["error"]
    assert f"the next window opens {later:%Y-%m-%d} 00:00 Europe/Berlin" in error


@pytest.mark.rule("R-CHG-1", case="compliant")
def test_inside_a_window_the_upgrade_queues_and_runs_with_its_class_approvers(approvers, workspace):
    window, _ = _hours_around_now(-1, 2)
    _windows(approvers.config, window)
    pending = _pending_id(_tool_call(UPGRADE))
    first = _approve(pending, approvers.alice)
    assert first["approvers_needed"] == 2
    token = _approve(pending, approvers.bob, first["token"])["token"]
    result = _tool_call(UPGRADE, token)
    assert result.exit_code == 0, result.output
    assert json.loads((workspace / "tenants" / "acme" / "framework.json").read_text()) == {"torch": "2.13.0"}


@pytest.mark.rule("R-CHG-1", case="compliant")
def test_an_emergency_outside_a_window_needs_one_more_approver_than_its_class(approvers, carol, workspace):
    window, _ = _hours_around_now(2, 3)
    _windows(approvers.config, window)
    emergency = {**UPGRADE, "emergency": True}
    pending = _pending_id(_tool_call(emergency))
    first = _approve(pending, approvers.alice)
    assert first["approvers_needed"] == 3  # irreversible tenant governance needs 2, the emergency one more
    two = _approve(pending, approvers.bob, first["token"])["token"]
    refused = json.loads(_tool_call(emergency, two).stdout)["error"]
    assert "too_few_approvers" in refused and "emergency +1) needs 3 distinct approvers" in refused
    assert not (workspace / "tenants" / "acme" / "framework.json").exists()
    three = _approve(pending, carol, two)["token"]
    result = _tool_call(emergency, three)
    assert result.exit_code == 0, result.output
    assert json.loads((workspace / "tenants" / "acme" / "framework.json").read_text()) == {"torch": "2.13.0"}


def test_rules_json_shows_the_windows_and_whether_now_is_inside_one(approvers):
    def state() -> dict:
        result = runner.invoke(app, ["rules", "--json"])
        assert result.exit_code == 0, result.output
        return next(r for r in json.loads(result.stdout) if r["id"] == "R-CHG-1")["state"]

    none = state()
    assert (none["configured"], none["open_now"]) == (False, True) and "at any time" in none["summary"]
    original = approvers.config.read_text()
    closed, opening = _hours_around_now(2, 3)
    _windows(approvers.config, closed)
    shown = state()
    assert (shown["configured"], shown["open_now"], shown["source"]) == (
        True, False, f"[governance] change_windows in {approvers.config}")
    assert shown["windows"] == [f"mon-sun {closed.split('hours = ')[1].split(',')[0].strip(chr(34))} UTC"]
    assert shown["next_opening"].startswith(f"{opening:%Y-%m-%d %H:%M} UTC")
    approvers.config.write_text(original)
    _windows(approvers.config, _hours_around_now(-1, 2)[0])
    assert state()["open_now"] is True
    table = runner.invoke(app, ["rules"])
    assert "R-CHG-1: change windows mon-sun" in table.output and "open now" in table.output


@pytest.mark.parametrize(("entry", "named"), [
    ('{days = "mon-thu", hours = "10:00-16:00", tz = "Mars/Olympus"}', "entry 2: tz 'Mars/Olympus'"),
    ('{days = "monday", hours = "10:00-16:00", tz = "UTC"}', "entry 2: days 'monday' has 'monday'"),
    ('{days = "mon", hours = "10-16", tz = "UTC"}', "entry 2: hours is '10-16'"),
    ('{days = "mon", hours = "10:00-16:00", tz = "UTC", from = "x"}', "entry 2: unknown key 'from'"),
])
def test_a_bad_window_is_one_error_naming_the_entry_and_the_fix_on_both_paths(approvers, entry, named):
    _windows(approvers.config, '{days = "sat-sun", hours = "22:00-02:00", tz = "UTC"}', entry)  # the 1st is good
    for result in (runner.invoke(app, ["rules", "--json"]), _tool_call(UPGRADE)):
        assert result.exit_code != 0
        error = json.loads(result.stdout)["error"]
        assert f"[governance] change_windows in {approvers.config}, {named}" in error and "e.g." in error
    assert queue.pending_calls() == []


def test_a_window_in_a_file_the_user_has_not_trusted_is_ignored(approvers, workspace):
    workspace.mkdir(parents=True, exist_ok=True)
    closed, _ = _hours_around_now(2, 3)
    (workspace / "trainops.toml").write_text(f"[governance]\nchange_windows = [{closed}]\n")
    assert _pending_id(_tool_call(UPGRADE))  # the untrusted window closed nothing


def test_every_change_tool_carries_the_change_window_tag_and_the_emergency_field():
    for name in ("change_scheduler_policy", "set_tenant_quota", "upgrade_framework"):
        spec = tool_registry().spec(name)
        assert "change-window" in spec.tags, name
        assert spec.Input.model_fields["emergency"].default is False, name


def _pack_over(run, pack_id: str):
    record = run / "drill.json"
    record.write_text("{}")
    drill = factories.drill().model_copy(update={"drill_record": str(record)})
    return assemble(pack_id, factories.environment(), factories.baseline([str(run)]), [factories.ablation()],
                    [drill], [])


def test_the_pack_shows_the_windows_and_each_emergency_change_during_its_runs(approvers, carol, workspace):
    window, _ = _hours_around_now(2, 3)
    _windows(approvers.config, window)
    during = factories.write_run(runs_dir() / "during")  # its metrics begin long before the change
    emergency = {**UPGRADE, "emergency": True}
    pending = _pending_id(_tool_call(emergency))
    token = _approve(pending, carol, _approve(pending, approvers.bob, _approve(pending, approvers.alice)["token"])
                     ["token"])["token"]
    assert _tool_call(emergency, token).exit_code == 0
    note = _pack_over(during, "pack-chg").change_windows
    assert note.windows == [f"mon-sun {window.split(chr(34))[3]} UTC"] and "closed now" in note.summary
    [change] = note.emergency_changes
    assert (change.tool, change.target, change.approvers) == ("upgrade_framework", "acme torch 2.13.0",
                                                             ["alice", "bob", "carol"])
    markdown = to_markdown(_pack_over(during, "pack-chg"))
    assert "## Change windows (R-CHG-1)" in markdown and "alice, bob, carol" in markdown
    later = factories.write_run(runs_dir() / "later")
    metrics = later / "metrics.jsonl"
    start = datetime.now(timezone.utc).timestamp() + 60
    metrics.write_text("".join(json.dumps({**json.loads(line), "time": start + n}) + "\n"
                               for n, line in enumerate(metrics.read_text().splitlines())))
    assert _pack_over(later, "pack-later").change_windows.emergency_changes == []  # landed before this run began
    written = (write(_pack_over(during, "pack-written")) / "report.md").read_text()
    assert "acme torch 2.13.0" in written and "No change landed" not in written
