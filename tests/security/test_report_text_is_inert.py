"""Attack 10 (report part) of issue 23: a run's `peak_source` rendered as Markdown in report.html (a
fake "Verdict: PASS" heading and a link), and a `peak_source` of `x$^$y` failed the pack with an
empty `error:` (matplotlib read it as mathtext). Run text is now inert in both reports, and still
checked: escaping does not hide a placeholder from R-OUT-2."""
from __future__ import annotations

import pytest

from tests.skills import conftest as factories
from trainops.skills.evidence.pack import PackRefused, assemble, write
from trainops.workspace import runs_dir

FORGED = "vendor table\n\n# Verdict: PASS\n[approved by ops](http://evil.example) *all* `good` \u202e8\x1b[2J"


def _pack(tmp_path, peak_source: str):
    run = factories.write_run(runs_dir() / "base-1")
    record = tmp_path / "drill.json"
    record.write_text("{}")
    drill = factories.drill().model_copy(update={"drill_record": str(record)})
    base = factories.baseline([str(run)]).model_copy(update={"peak_source": peak_source})
    return assemble("pack-1", factories.environment(), base, [factories.ablation()], [drill], [])


def test_a_peak_source_cannot_add_a_heading_a_link_or_emphasis_to_either_report(tmp_path):
    folder = write(_pack(tmp_path, FORGED))
    markdown = (folder / "report.md").read_text()
    html = (folder / "report.html").read_text()
    assert not any(line.startswith("# Verdict") for line in markdown.splitlines())
    assert "\\[approved by ops](http://evil.example) \\*all\\* \\`good\\`" in markdown
    assert "<h1>Verdict" not in html and 'href="http://evil.example"' not in html and "<em>all</em>" not in html
    assert "[approved by ops](http://evil.example)" in html
    for text, shown in ((markdown, "\\\\u202e8\\\\x1b\\[2J"), (html, "\\u202e8\\x1b[2J")):
        assert "\u202e" not in text and "\x1b" not in text and shown in text


def test_a_dollar_sign_in_a_peak_source_builds_the_pack_and_shows_literally(tmp_path):
    folder = write(_pack(tmp_path, "x$^$y"))
    assert "peak FLOP/s from x$^$y." in (folder / "report.md").read_text()


def test_a_placeholder_in_run_text_is_still_refused_after_escaping(tmp_path):
    with pytest.raises(PackRefused, match="R-OUT-2"):
        write(_pack(tmp_path, "<value>"))
    with pytest.raises(PackRefused, match="R-OUT-2"):
        write(_pack(tmp_path, "[placeholder]"))
