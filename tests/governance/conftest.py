"""Governance tests tag each rule case: `@pytest.mark.rule("R-ENV-1", case="violation")` on a test
(or in `pytest.param(..., marks=...)`) that shows the rule refusing a violation, and
`case="compliant"` on one that shows a compliant case accepted. test_rules_coverage.py reads
these marks and fails for any AGENTS.md rule lacking either."""
from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line("markers", "rule(rule_id, case): the AGENTS.md rule a test shows refused (violation) "
                                       "or accepted (compliant)")
