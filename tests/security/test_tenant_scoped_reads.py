"""A caller scoped to a tenant (`TRAINOPS_TENANT`: a tenant's shell or agent session) reads and
quarantines only that tenant's runs and checkpoints (A-SEC-3, R-SEC-3). Driven through `trainops
tool call`, the path an agent's tools and a person's commands share: another tenant's run named
by its folder, a run outside every tenant, a mixed comparison, another tenant's job and a quarantine
of another tenant's checkpoints are each refused before anything is read or queued; the tenant's own
run, named by its bare id, resolves inside its own area. Unscoped, the operator reads every run."""
from __future__ import annotations

import json
import sys
import time

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.governance import queue

runner = CliRunner()
OPERATOR = CallContext(actor="operator")


def _run(folder, first_loss: float = 9.0):
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text('[model]\npreset = "tiny"\n')
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"step": step, "rank": 0, "loss": first_loss - 0.1 * step, "step_time_s": 0.1,
                    "tokens_per_s": 1000.0, "mfu_pct": 3.0, "time": time.time()}) + "\n" for step in range(1, 6)))
    return folder


def _tool(name: str, inp: dict):
    return runner.invoke(app, ["tool", "call", name, "--input", json.dumps(inp), "--json"], env={"COLUMNS": "200"})


@pytest.fixture
def tenants(workspace):
    return {"acme": _run(workspace / "tenants" / "acme" / "runs" / "r-acme", first_loss=5.0),
            "globex": _run(workspace / "tenants" / "globex" / "runs" / "r-globex"),
            "none": _run(workspace / "runs" / "r-shared")}


def test_a_tenant_reads_its_own_run_by_its_bare_id(tenants, monkeypatch):
    monkeypatch.setenv("TRAINOPS_TENANT", "acme")
    done = _tool("summarize_run", {"run": "r-acme"})
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["final_loss"] == pytest.approx(4.5)  # acme's run, not another's r-acme


@pytest.mark.parametrize("name, inp", [
    ("summarize_run", {"run": "GLOBEX"}),
    ("summarize_run", {"run": "SHARED"}),
    ("find_straggler", {"run": "GLOBEX"}),
    ("compare_runs", {"baseline": "ACME", "candidate": "GLOBEX"}),
    ("list_checkpoints", {"run": "GLOBEX"}),
    ("sdc_case", {"run": "GLOBEX"}),
])
def test_another_tenants_run_is_refused(tenants, monkeypatch, name, inp):
    monkeypatch.setenv("TRAINOPS_TENANT", "acme")
    paths = {"ACME": str(tenants["acme"]), "GLOBEX": str(tenants["globex"]), "SHARED": str(tenants["none"])}
    refused = _tool(name, {key: paths[value] for key, value in inp.items()})
    assert refused.exit_code != 0
    assert "R-SEC-3" in refused.output and "outside tenant acme's area" in refused.output, refused.output


def test_a_quarantine_of_another_tenants_checkpoints_is_refused_before_it_is_queued(tenants, monkeypatch):
    monkeypatch.setenv("TRAINOPS_TENANT", "acme")
    refused = _tool("quarantine_checkpoints", {"run": str(tenants["globex"]), "from_step": 1})
    assert refused.exit_code != 0 and "outside tenant acme's area" in refused.output, refused.output
    assert queue.pending_calls() == []


def test_another_tenants_job_is_refused(tenants, monkeypatch):
    done = {"name": "globex-job", "launcher": "plain", "command": [sys.executable, "-c", "print('globex secret')"],
            "tenant": "globex", "run_dir": str(tenants["globex"])}
    job_id = call("submit_job", {"spec": done}, OPERATOR).handle.job_id
    assert call("wait_job", {"job_id": job_id, "timeout_s": 30}, OPERATOR).state == "completed"
    monkeypatch.setenv("TRAINOPS_TENANT", "acme")
    refused = _tool("job_logs", {"job_id": job_id})
    assert refused.exit_code != 0 and "tenant globex's job" in refused.output, refused.output
    assert "globex secret" not in refused.output
    monkeypatch.setenv("TRAINOPS_TENANT", "globex")
    assert "globex secret" in _tool("job_logs", {"job_id": job_id}).output


def test_unscoped_the_operator_reads_every_tenants_run(tenants, monkeypatch):
    monkeypatch.delenv("TRAINOPS_TENANT", raising=False)
    for folder in tenants.values():
        assert _tool("summarize_run", {"run": str(folder)}).exit_code == 0


def test_a_malformed_tenant_scope_is_refused_naming_the_variable(tenants, monkeypatch):
    monkeypatch.setenv("TRAINOPS_TENANT", "../globex")
    refused = _tool("summarize_run", {"run": str(tenants["globex"])})
    assert refused.exit_code != 0 and "TRAINOPS_TENANT" in refused.output, refused.output
