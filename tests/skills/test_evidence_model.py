"""The evidence pack model refuses packs a human should never be asked to approve."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from trainops.skills.evidence.model import SCHEMA_PATH, EvidencePack
from trainops.skills.evidence.pack import assemble, decide


def test_mfu_claims_without_environment_declaration_are_refused(factories):
    with pytest.raises(ValidationError, match="environment: missing"):
        assemble("p1", None, factories.baseline(["r1"]), [], [], [])


def test_verdict_pass_with_blockers_is_refused(factories):
    with pytest.raises(ValidationError, match="'pass' with blockers"):
        EvidencePack(pack_id="p", created_time=0, verdict="pass", blockers=["x"], environment=factories.environment())


def test_non_pass_verdict_must_name_blockers(factories):
    with pytest.raises(ValidationError, match="blockers: empty"):
        EvidencePack(pack_id="p", created_time=0, verdict="partial", environment=factories.environment())


def test_ablation_verdict_must_follow_from_change_and_noise_band(factories):
    with pytest.raises(ValidationError, match="expected 'within-noise'"):
        factories.ablation(change=3.0, band=5.0, verdict="gain")


def test_complete_sop_with_a_gain_passes(factories):
    verdict, blockers = decide(factories.baseline(["r"]), [factories.ablation()], [factories.drill()])
    assert (verdict, blockers) == ("pass", [])


def test_no_arm_beyond_noise_gives_partial(factories):
    verdict, blockers = decide(factories.baseline(["r"]), [factories.ablation(1.0, 5.0, "within-noise")],
                               [factories.drill()])
    assert verdict == "partial" and blockers == ["no ablation arm beat the run-to-run noise band"]


def test_gain_vanishing_at_scale_fails(factories):
    verdict, blockers = decide(factories.baseline(["r"]), [factories.ablation(vanished=True)], [factories.drill()])
    assert verdict == "fail" and "vanished at target scale" in blockers[0]


def test_broken_checkpoint_after_drill_fails(factories):
    verdict, blockers = decide(factories.baseline(["r"]), [factories.ablation()], [factories.drill(intact=False)])
    assert verdict == "fail" and "failed verification" in blockers[0]


def test_exported_schema_matches_the_model():
    assert json.loads(SCHEMA_PATH.read_text()) == EvidencePack.model_json_schema()


def test_too_few_repeats_cannot_pass(factories):
    base = factories.baseline(["r"]).model_copy(update={"repeats": 2})
    verdict, blockers = decide(base, [factories.ablation()], [factories.drill()])
    assert verdict == "partial" and blockers[0].startswith("baseline has 2 repeat(s); 3 or more")
