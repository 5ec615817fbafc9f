"""AGENTS.md and the code never drift: every rule ID has an enforcement that imports, and a
tagged test showing a violation refused and a compliant case accepted."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.governance.rules import RULES, agents_md_path

HERE = Path(__file__).parent
RULE_LINE = re.compile(r"^\s*-\s+\*\*(R-[A-Z]+-\d+)\*\*\s+—\s+(.+)$")


def agents_md_rules() -> dict[str, str]:
    """Rule ID -> text, from the bullets `- **R-XXX-N** — text` in the shipped AGENTS.md."""
    text = agents_md_path().read_text(encoding="utf-8")
    return {m.group(1): m.group(2).strip() for m in map(RULE_LINE.match, text.splitlines()) if m}


def _tagged_cases() -> dict[str, set[str]]:
    """Rule ID -> {"violation", "compliant"} from every `pytest.mark.rule(ID, case=...)` in this folder."""
    cases: dict[str, set[str]] = {}
    for path in HERE.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.mark.rule":
                rule_id = node.args[0].value
                case = next(k.value.value for k in node.keywords if k.arg == "case")
                cases.setdefault(rule_id, set()).add(case)
    return cases


def test_agents_md_declares_rules_in_every_required_section():
    ids = agents_md_rules()
    for prefix in ("R-ENV-", "R-ABL-", "R-EVD-", "R-ESC-", "R-SEC-", "R-SCH-", "R-OUT-"):
        assert any(i.startswith(prefix) for i in ids), prefix


def test_every_agents_md_rule_has_an_enforcement_and_no_extra_ones():
    ids = set(agents_md_rules())
    assert ids - RULES.keys() == set(), "rules in AGENTS.md without enforcement"
    assert RULES.keys() - ids == set(), "enforcements for rules AGENTS.md does not state"


def test_every_enforcement_resolves_to_code():
    for rule in RULES.values():
        assert callable(rule.resolve()), rule.id


def test_every_rule_has_a_violation_and_a_compliant_test():
    cases = _tagged_cases()
    missing = {rid: sorted({"violation", "compliant"} - cases.get(rid, set()))
               for rid in agents_md_rules() if cases.get(rid) != {"violation", "compliant"}}
    assert missing == {}


def test_rules_cli_lists_every_rule_as_json():
    result = CliRunner().invoke(app, ["rules", "--json"])
    assert result.exit_code == 0, result.output
    listed = json.loads(result.output)
    assert {r["id"] for r in listed} == set(agents_md_rules())
    assert all({"id", "title", "enforcement", "where"} <= r.keys() for r in listed)
