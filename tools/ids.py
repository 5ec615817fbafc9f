"""The shapes of the ids a tool's input names: a job, a node, a run, a recorded change, a tenant.

Every id-like field of every tool input is one of these: never empty, and held to a pattern, so an
empty or garbled id a model sends is refused at validation, naming the field, before the gate
queues anything for a human (an empty `drain_node` was once queued for approval). The patterns are
in the JSON schema a model sees. tests/tools/test_id_fields.py walks every tool's input and fails on
an id-like string field without them.
"""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator, StringConstraints

SAFE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
"""trainops' own ids (runs, changes, threads, packs): a letter or digit, then letters, digits, _ . -"""
JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/+@-]{0,252}$"
"""What schedulers hand out: local 'train-20260101-120000-a1b2c3', Slurm '1234' or '1234_5', a
Kubernetes 'namespace/name'."""
NODE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$"
"""One host name as the scheduler knows it (no host lists, no spaces)."""
RUN_REF_PATTERN = r"^[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]{0,499}$"
"""A run id, or a run folder path (confined to the workspace by trainops.workspace.run_folder)."""
TENANT_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
"""A tenant id names a folder, a Slurm account and a Prometheus label: one strict form for all three."""


SLURM_OWN_NAMES = frozenset({"root", "normal", "slurm", "default", "all", "none", "unknown"})
"""Accounts and QOS Slurm creates or reserves itself (the root account, the default QOS 'normal'): a tenant
named so would rewrite limits every user's jobs run under, and its rollback would delete Slurm's own."""


def tenant_id_problem(value: object) -> str | None:
    """Why `value` is not a tenant id (matched in full: no newline, path or control character), or None."""
    if isinstance(value, str) and value in SLURM_OWN_NAMES:
        return (f"tenant id {value!r} names one of Slurm's own accounts or QOS ({', '.join(sorted(SLURM_OWN_NAMES))}): "
                "a tenant needs a name of its own, e.g. 'team-a'")
    if isinstance(value, str) and TENANT_ID.fullmatch(value):
        return None
    return (f"tenant id {value!r} is not valid: use 1 to 63 lowercase letters, digits, '_' or '-', starting with "
            "a letter or digit (e.g. 'acme', 'team-a')")


def check_tenant_id(value: object) -> object:
    problem = tenant_id_problem(value)
    if problem:
        raise ValueError(problem)
    return value


JobId = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=JOB_ID_PATTERN)]
NodeName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=NODE_PATTERN)]
RunRef = Annotated[str, StringConstraints(min_length=1, max_length=500, pattern=RUN_REF_PATTERN)]
SafeId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=SAFE_ID_PATTERN)]
# the check that says what a tenant id is runs first, so a bad one reads as such, not as a bare pattern
TenantId = Annotated[str, BeforeValidator(check_tenant_id),
                     StringConstraints(min_length=1, max_length=63, pattern=f"^{TENANT_ID.pattern}$")]
