"""Issue 41, class 2, the inputs' half: a quota a human is asked to sign names a tenant of its own and
counts Slurm can store. Through `trainops tool call set_tenant_quota`: refused at validation, naming
the field, before anything is queued for approval (Slurm itself is not needed to refuse them)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from trainops.cli import app

runner = CliRunner()


def _call(**inp):
    return runner.invoke(app, ["tool", "call", "set_tenant_quota", "--input",
                               json.dumps({"priority": "low", "reason": "trial", **inp}), "--json"])


@pytest.mark.parametrize("tenant", ["root", "normal"])
def test_a_tenant_named_like_slurms_own_account_or_qos_is_refused(tenant):
    result = _call(tenant=tenant, cpus=4)
    assert result.exit_code == 2 and "tenant" in result.output and "Slurm's own" in result.output
    assert json.loads(runner.invoke(app, ["approvals", "--json"]).output) == []


@pytest.mark.parametrize("field", ["max_jobs", "cpus", "gpus"])
def test_a_count_past_what_slurm_stores_is_refused_not_wrapped(field):
    result = _call(tenant="acme", **{field: 4294967296})  # GrpJobs=4294967296 once wrapped to 0
    assert result.exit_code == 2 and f"{field}: Input should be less than or equal to 4294967293" in result.output
    assert json.loads(runner.invoke(app, ["approvals", "--json"]).output) == []
