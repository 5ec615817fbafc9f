"""Writing a pack: governance validates it first; an invalid pack leaves nothing on disk. The reports
render one view: verdict banner, real tables, plots in their sections, escaped run text."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer

from trainops.cli import app
from trainops.skills.evidence import plots
from trainops.skills.evidence.pack import PackRefused, assemble, load, write
from trainops.skills.evidence.render import to_html, to_markdown
from trainops.skills.evidence.view import DECISION_COMMANDS
from trainops.workspace import packs_dir, runs_dir


def _pack(factories, tmp_path, pack_id="pack-1", **drill_kw):
    run = factories.write_run(runs_dir() / "base-1")
    drill = factories.drill(**drill_kw)
    record = tmp_path / "drill.json"
    record.write_text("{}")
    drill = drill.model_copy(update={"drill_record": str(record)})
    return assemble(pack_id, factories.environment(), factories.baseline([str(run)]), [factories.ablation()], [drill],
                    [])


def test_markdown_first_line_is_the_verdict_and_its_blockers(factories, tmp_path):
    pack = _pack(factories, tmp_path)
    pack = pack.model_copy(update={"verdict": "partial", "blockers": ["no drill at target scale"]})
    assert to_markdown(pack).splitlines()[0] == "Verdict: PARTIAL — blockers: no drill at target scale"


def test_valid_pack_is_written_with_json_markdown_html_and_plots(factories, tmp_path):
    folder = write(_pack(factories, tmp_path))
    assert folder == packs_dir() / "pack-1"
    assert load(folder).verdict == "pass"
    assert {p.name for p in (folder / "plots").iterdir()} == {"loss_mfu.png", "ablation.png", "drill_timeline.png"}
    assert (folder / "report.html").read_text().count("data:image/png;base64,") == 3
    assert json.loads((folder / "evidence.json").read_text())["pack_id"] == "pack-1"


def test_pack_citing_a_run_without_metrics_is_refused_and_not_written(factories, tmp_path):
    pack = _pack(factories, tmp_path)
    pack.baseline.run_dirs[0] = str(tmp_path / "no-such-run")
    with pytest.raises(PackRefused, match="R-ENV-2"):
        write(pack)
    assert list(packs_dir().iterdir()) == []


def test_placeholder_text_in_the_pack_is_refused_and_not_written(factories, tmp_path):
    pack = _pack(factories, tmp_path)
    pack = pack.model_copy(update={"rollback": "TODO write the rollback"})
    with pytest.raises(PackRefused, match="R-OUT-2"):
        write(pack)
    assert list(packs_dir().iterdir()) == []


def test_drill_without_its_record_is_refused(factories, tmp_path):
    pack = _pack(factories, tmp_path)
    pack.fault_tolerance.drills[0].drill_record = str(tmp_path / "missing.json")
    with pytest.raises(PackRefused, match="R-EVD-2"):
        write(pack)


def _written(factories, tmp_path, **update):
    pack = _pack(factories, tmp_path)
    return write(pack.model_copy(update=update) if update else pack)


def test_html_report_opens_with_a_coloured_verdict_banner_listing_the_blockers(factories, tmp_path):
    folder = _written(factories, tmp_path, verdict="partial", blockers=["no drill at target scale"])
    html = (folder / "report.html").read_text()
    assert '<header class="banner verdict-partial"' in html
    assert '<div class="verdict-word">PARTIAL</div>' in html
    assert "<li>no drill at target scale</li>" in html
    assert html.index("verdict-word") < html.index("<table>")


def test_html_report_has_real_tables_not_the_markdown_source(factories, tmp_path):
    html = (_written(factories, tmp_path) / "report.html").read_text()
    assert html.count("<table>") == 5  # figures, S1, S2, S3/S4, S5
    assert "|---" not in html and "<pre>" not in html


def test_numbers_are_right_aligned_in_both_reports(factories, tmp_path):
    folder = _written(factories, tmp_path)
    assert '<td class="right number">0.1000 s</td>' in (folder / "report.html").read_text()
    assert "|---|---:|---:|---:|---:|" in (folder / "report.md").read_text()


def test_every_ablation_delta_carries_its_noise_band_and_mark_in_both_reports(factories, tmp_path):
    folder = _written(factories, tmp_path)
    assert "▲ +12.0% ± 5.0%" in (folder / "report.md").read_text()
    assert '<td class="right gain">▲ +12.0% ± 5.0%</td>' in (folder / "report.html").read_text()


def test_each_plot_is_embedded_in_the_section_it_belongs_to(factories, tmp_path):
    html = (_written(factories, tmp_path) / "report.html").read_text()
    sections = {part.split('"', 1)[0]: part for part in html.split('<section id="')[1:]}
    assert {key: part.count("data:image/png;base64,") for key, part in sections.items()} == {
        "figures": 0, "s1": 0, "s2": 1, "s3": 1, "s5": 1, "chg": 0}


def test_text_from_runs_is_escaped_in_the_html(factories, tmp_path):
    pack = _pack(factories, tmp_path)
    pack.ablations[0].source_run = "runs/<img src=x onerror=alert(1)>"
    pack.rollback = "restore <script>alert(1)</script>"
    html = to_html(pack)
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_identical_baseline_repeats_are_named_as_such_under_the_plot(factories, tmp_path):
    runs = [str(factories.write_run(runs_dir() / f"same-{i}")) for i in (1, 2)]
    figure = plots.curves(assemble("p", factories.environment(), factories.baseline(runs), [], [], []))
    assert "loss and MFU curves of all 2 repeats are identical" in figure.caption


def test_differing_baseline_repeats_are_not_called_identical(factories, tmp_path):
    runs = [str(factories.write_run(runs_dir() / f"run-{i}", mfu_pct=2.0 + i)) for i in (1, 2)]
    figure = plots.curves(assemble("p", factories.environment(), factories.baseline(runs), [], [], []))
    assert "The loss curves of all 2 repeats are identical" in figure.caption
    assert "MFU curves" not in figure.caption


@pytest.mark.parametrize("decision", ["approve", "reject"])
def test_the_reports_decision_commands_parse_with_the_current_cli(decision):
    """A renamed or removed option breaks this test, not a reviewer's copy-paste."""
    words = shlex.split(DECISION_COMMANDS[decision].format(pack_id="pack-1"))
    assert words[:2] == ["trainops", decision]
    root = typer.main.get_command(app)
    command = root.get_command(click.Context(root), decision)
    context = command.make_context(decision, words[2:])
    assert context.params["pack"] == "pack-1"


def test_evidence_show_open_hands_report_html_to_the_users_browser(factories, tmp_path, workspace):
    folder = _written(factories, tmp_path)
    opened = tmp_path / "opened.txt"
    browser = tmp_path / "browser.sh"
    browser.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {opened}\n')
    browser.chmod(0o755)
    env = {**os.environ, "TRAINOPS_HOME": str(workspace), "BROWSER": f"{browser} %s"}
    done = subprocess.run([str(Path(sys.executable).parent / "trainops"), "evidence", "show", "pack-1", "--open",
                           "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert opened.read_text() == (folder / "report.html").as_uri()


def test_evidence_show_open_without_a_working_browser_says_so(factories, tmp_path, workspace):
    _written(factories, tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env.update(TRAINOPS_HOME=str(workspace), BROWSER="false %s", PATH="/bin:/usr/bin")
    done = subprocess.run([str(Path(sys.executable).parent / "trainops"), "evidence", "show", "pack-1", "--open",
                           "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert json.loads(done.stdout)["error"].startswith("--open: no web browser found to open")
