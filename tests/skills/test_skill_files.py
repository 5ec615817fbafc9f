"""Every SKILL.md passes the Agent Skills reference validator, and every step maps to code."""
from __future__ import annotations

from pathlib import Path

import pytest
from skills_ref import validate

from trainops.skills.registry import MAIN_SKILL, all_skills, parse_steps, skill_dirs

EXPECTED = {MAIN_SKILL, "environment-declaration", "baseline", "ablation", "fault-drill", "checkpoint-plan",
            "evidence-pack"}


def test_all_expected_skills_exist():
    assert {p.name for p in skill_dirs()} == EXPECTED


@pytest.mark.parametrize("folder", skill_dirs(), ids=lambda p: p.name)
def test_skill_passes_the_reference_validator(folder):
    assert validate(folder) == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_step_has_an_implementation(name):
    steps = all_skills()[name].steps
    assert steps, f"{name} has no numbered steps under '## Steps'"
    for step in steps:
        assert callable(step.resolve())


def test_main_skill_has_steps_one_to_eight():
    assert [s.number for s in all_skills()[MAIN_SKILL].steps] == list(range(1, 9))


def test_a_step_without_an_implementation_is_reported():
    (step,) = parse_steps("## Steps\n1. Do something clever.\n")
    with pytest.raises(LookupError, match="names no implementation"):
        step.resolve()


def test_root_skill_md_is_the_main_skill_with_one_source():
    root_skill = Path(__file__).resolve().parents[2] / "SKILL.md"
    assert root_skill.is_symlink(), "the root SKILL.md must be a link to the main skill, not a copy"
    assert root_skill.resolve() == (skill_dirs()[0].parent / MAIN_SKILL / "SKILL.md").resolve()
