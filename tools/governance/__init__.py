"""Governance: the gate every tool call passes, rules, approvals and the audit log."""
