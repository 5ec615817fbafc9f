"""The figures table after review (issue 39 review items 8-9): 'time lost per interruption' is not
a drill's recovery time, so drills stay out of it as they do of MTBF; a pack written before the
figures table (figures == []) is not refused as edited, and says why it was not compared; the
checkpoint plan's MTBF level is the typed level, never a word searched for in the basis text."""
from __future__ import annotations

from tests.skills.test_figures_defined_once import _pack
from trainops.skills.evidence import figures as pack_figures
from trainops.skills.evidence.pack import derivation_notes, derivation_problems, write
from trainops.tools.reliability.ettr import reliability
from trainops.tools.reliability.evidence import Evidence
from trainops.tools.reliability.interruptions import Interruption


def _record(n: int, drill: bool, lost: float) -> Interruption:
    return Interruption(id=f"local:{n}@0", job_id=str(n), scheduler="local", detected_at=1000.0 * n, drill=drill,
                        cause="injected" if drill else "software", cause_reason="test", evidence=Evidence(),
                        time_lost_s=lost)


def test_time_lost_per_interruption_leaves_drills_out():
    records = [_record(1, True, 5.0), _record(2, True, 6.0), _record(3, False, 100.0)]
    assert reliability(records=records).recovery_time_s == 100.0
    assert reliability(records=[_record(1, True, 5.0)]).recovery_time_s is None  # drills only: none measured


def test_a_pack_built_before_the_figures_table_is_not_refused_as_edited(factories, tmp_path):
    record = tmp_path / "drill.json"
    record.write_text("{}")
    folder = write(_pack(factories, str(record)), tmp_path / "packs")
    pack = _pack(factories, str(record)).model_copy(update={"figures": []})  # evidence.json as written before the table
    problems = derivation_problems(pack, folder)
    assert not any("figures table" in p for p in problems), problems
    assert any("built before the figures table" in n for n in derivation_notes(pack))
    assert derivation_notes(_pack(factories)) == []


def test_an_edited_figures_table_is_still_refused(factories, tmp_path):
    pack = _pack(factories)
    edited = pack.model_copy(update={"figures": [pack.figures[0].model_copy(update={"value": 12345.0}),
                                                 *pack.figures[1:]]})
    assert any("figures table" in p for p in derivation_problems(edited, tmp_path))


def test_the_plans_mtbf_level_is_the_typed_level_not_a_word_in_its_basis(factories):
    pack = _pack(factories)
    plan = pack.checkpoint_plan.model_copy(update={"mtbf_basis": "not measured: nothing declared, assumed default",
                                                   "mtbf_level": "assumed default"})
    pack = pack.model_copy(update={"checkpoint_plan": plan, "baseline": pack.baseline.model_copy(
        update={"reliability": None})})
    figure = next(f for f in pack_figures.table(pack) if f.name == "MTBF used by the checkpoint plan")
    assert figure.level == "assumed default"
    plan = plan.model_copy(update={"mtbf_basis": "the operator's figure", "mtbf_level": "declared"})
    figure = next(f for f in pack_figures.table(pack.model_copy(update={"checkpoint_plan": plan}))
                  if f.name == "MTBF used by the checkpoint plan")
    assert figure.level == "declared"
