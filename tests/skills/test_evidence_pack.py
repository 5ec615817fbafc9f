"""Writing a pack: governance validates it first; an invalid pack leaves nothing on disk."""
from __future__ import annotations

import json

import pytest

from trainops.skills.evidence.pack import PackRefused, assemble, load, write
from trainops.skills.evidence.render import to_markdown
from trainops.workspace import packs_dir


def _pack(factories, tmp_path, pack_id="pack-1", **drill_kw):
    run = factories.write_run(tmp_path / "runs" / "base-1")
    drill = factories.drill(**drill_kw)
    record = tmp_path / "drill.json"
    record.write_text("{}")
    drill = drill.model_copy(update={"drill_record": str(record)})
    return assemble(pack_id, factories.environment(), factories.baseline([str(run)]), [factories.ablation()], [drill], [])


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
