"""The system prompt: every skill's name and description, the chosen skill's full text only,
and the rule that tool output is data."""
from __future__ import annotations

import pytest

from trainops.agents.prompt import DATA_RULE, choose_skill, load_skills, system_prompt


@pytest.mark.parametrize("request_text, skill", [
    ("run the SOP on config job.toml", "training-efficiency-ablation-and-fault-sop"),
    ("drill a rank crash on job 7", "fault-drill"),
    ("plan the checkpoint interval for a 5-minute save and an MTBF of 3 hours", "checkpoint-plan"),
])
def test_a_request_chooses_the_skill_that_matches_it(request_text, skill):
    assert choose_skill(request_text, load_skills()).name == skill


def test_a_request_that_matches_no_skill_chooses_none():
    assert choose_skill("hello there", load_skills()) is None


def test_prompt_lists_every_skill_but_carries_only_the_chosen_body():
    skills = load_skills()
    drill = next(s for s in skills if s.name == "fault-drill")
    ablation = next(s for s in skills if s.name == "ablation")
    prompt = system_prompt(skills, "fault-drill")
    assert all(f"- {s.name}: {s.description}" in prompt for s in skills)
    assert drill.body in prompt and ablation.body not in prompt
    assert prompt.endswith(DATA_RULE)


def test_prompt_starts_from_the_agents_contract_with_its_rule_ids():
    prompt = system_prompt(load_skills(), None)
    assert "# Contract (AGENTS.md)" in prompt and "R-SEC-4" in prompt
