"""The SKILL.md files name only tools the agent can call, and the SOP skill the agent loads
(agents/prompt.py) tells it when to call the record, the watch and the escalation tools."""
from __future__ import annotations

import re

import pytest

from trainops.agents.agent_tools import agent_registry
from trainops.agents.prompt import load_skills, system_prompt
from trainops.skills.registry import MAIN_SKILL, all_skills

TOOL_NAME = re.compile(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`")  # a backticked snake_case name is a tool
RECORD_TOOLS = ("list_interruptions", "effective_training_time", "watch_job", "respond_to_sdc",
                "acknowledge_escalation")


@pytest.mark.parametrize("name", sorted(all_skills()))
def test_every_tool_a_skill_names_is_in_the_agent_registry(name):
    named = set(TOOL_NAME.findall(all_skills()[name].path.read_text(encoding="utf-8")))
    assert named - set(agent_registry()) == set()


def test_the_sop_the_agent_loads_says_when_to_call_each_record_and_escalation_tool():
    prompt = system_prompt(load_skills(), MAIN_SKILL)
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| `([a-z_]+)` \|.*\|$", prompt, re.MULTILINE)}
    assert set(RECORD_TOOLS) <= rows.keys()
    assert all(row.count("|") == 4 and len(row) > 80 for tool, row in rows.items() if tool in RECORD_TOOLS)
