"""The system prompt: every skill's name and description, the loaded skill's full text only,
and the rule that tool output is data. The model chooses the skill (tests/agents/test_agent_run.py)."""
from __future__ import annotations

from trainops.agents.prompt import DATA_RULE, load_skills, system_prompt


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
