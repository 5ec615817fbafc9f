"""The claim models run where the SOP builds a pack, not only in their own tests: every
published comparison is an `ExternalComparison` (R-EVD-3), and a pack's hand-over is read back
into an `EscalationReport` (R-ESC-1..4) by governance before the pack is written."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainops.skills.escalate import pack_signals
from trainops.skills.evidence import references
from trainops.skills.evidence.pack import PackRefused, assemble, write
from trainops.tools.governance.escalation import escalations_for, human_item
from trainops.workspace import packs_dir, runs_dir


def _overlap_arm(factories):
    return factories.ablation().model_copy(update={"category": "communication-overlap", "knob": "comm_overlap",
                                                   "value": "true", "scale": "2048 procs"})


def test_a_published_table_without_its_source_is_refused_where_the_sop_compares(factories, monkeypatch):
    """At a scale where MegaScale is comparable (a CPU run gets a 'not comparable' line, no comparison)."""
    gpus = factories.environment().model_copy(update={"hardware": "NVIDIA H100 (Hopper)", "backend": "nccl",
                                                      "accelerator_kind": "gpu"})
    table = references.published()
    monkeypatch.setattr(references, "published", lambda: {**table, "megascale": {**table["megascale"], "source": ""}})
    with pytest.raises(ValidationError, match="R-EVD-3: ExternalComparison lacks source"):
        references.annotate([_overlap_arm(factories)], gpus, 2048, "llama3-70b")
    with pytest.raises(ValidationError, match="R-EVD-3"):
        references.headline_notes(gpus, 2048, "llama3-70b")


def _vanished_pack(factories, tmp_path, awaiting: list[str]):
    run = factories.write_run(runs_dir() / "base-1")
    record = tmp_path / "drill.json"
    record.write_text("{}")
    drill = factories.drill().model_copy(update={"drill_record": str(record)})
    pack = assemble("pack-esc", factories.environment(), factories.baseline([str(run)]),
                    [factories.ablation(vanished=True)], [drill], [])
    return pack.model_copy(update={"awaiting_human": [*pack.awaiting_human, *awaiting]})


def test_a_pack_carrying_a_fired_rule_with_the_wrong_action_is_refused(factories, tmp_path):
    pack = _vanished_pack(factories, tmp_path, [])
    (fired,) = escalations_for(pack_signals(pack))
    assert fired.rule_id == "R-ESC-2"
    wrong = human_item(fired.model_copy(update={"action": "two_phase_async_checkpoint"}))
    with pytest.raises(PackRefused, match="R-ESC-2: escalations=.* miss a fired trigger"):
        write(_vanished_pack(factories, tmp_path, [wrong]))
    assert not packs_dir().exists() or list(packs_dir().iterdir()) == []


def test_a_pack_carrying_each_fired_rule_as_trainops_wrote_it_is_written(factories, tmp_path):
    pack = _vanished_pack(factories, tmp_path, [])
    items = [human_item(esc, "abc123def456") for esc in escalations_for(pack_signals(pack))]
    assert write(_vanished_pack(factories, tmp_path, items)).is_dir()
