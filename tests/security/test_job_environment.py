"""Attacker's tests (issue 23, attack 6): a job inherited the operator's whole environment and
ran `trainops approve --pending ID` through the inherited ssh-agent. A job gets an allow-list:
the trainer's, torchrun's and the scheduler's variables, never SSH_AUTH_SOCK, API keys, tokens
or trainops' configuration, on every scheduler."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.tools.schedulers.base import JobSpec, SchedulerError
from trainops.tools.schedulers.job_env import shell_filter
from trainops.tools.schedulers.kubernetes import job_manifest
from trainops.tools.schedulers.slurm import batch_script

OPERATOR = CallContext(actor="operator")
SECRETS = {"SSH_AUTH_SOCK": "/tmp/agent.sock", "OPENAI_API_KEY": "sk-secret", "GITHUB_TOKEN": "ghp-secret",
           "TRAINOPS_CONFIG": "/home/op/.config/trainops/config.toml", "TRAINOPS_ALLOWED_SIGNERS": "/op/signers",
           "XDG_CONFIG_HOME": "/home/op/.config", "UNRELATED_OPERATOR_VAR": "operator-only-value"}
PRINT_ENV = [sys.executable, "-c", "import json, os; print('ENV=' + json.dumps(dict(os.environ)))"]


@pytest.fixture
def operator_secrets(monkeypatch):
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")


def _job_env(job_id: str) -> dict[str, str]:
    deadline = time.monotonic() + 20
    while call("job_status", {"job_id": job_id}, OPERATOR).state != "completed":
        assert time.monotonic() < deadline, "the job did not complete"
        time.sleep(0.05)
    text = call("job_logs", {"job_id": job_id, "tail": 0}, OPERATOR).text
    line = next(line for line in text.splitlines() if line.startswith("ENV="))
    return json.loads(line.removeprefix("ENV="))


def test_a_local_job_gets_none_of_the_operators_secrets(workspace, operator_secrets):
    job = call("submit_job", {"spec": {"name": "printenv", "command": PRINT_ENV, "env": {"MY_SETTING": "1"}}},
               OPERATOR).handle
    env = _job_env(job.job_id)
    assert not set(SECRETS) & set(env), f"the job inherited {sorted(set(SECRETS) & set(env))}"
    assert env["TRAINOPS_HOME"] == str(workspace.resolve()) and env["MY_SETTING"] == "1"
    assert env["NCCL_DEBUG"] == "WARN" and "PATH" in env
    assert not [key for key in env if key.startswith("TRAINOPS_") and key != "TRAINOPS_HOME"]


def test_a_spec_that_names_a_secret_variable_is_refused_naming_it(workspace):
    spec = {"name": "leak", "command": PRINT_ENV, "env": {"OPENAI_API_KEY": "sk-x"}}
    with pytest.raises(ToolError, match=r"spec.env names OPENAI_API_KEY: a job never gets the operator's ssh-agent"):
        call("submit_job", {"spec": spec}, OPERATOR)


def test_a_slurm_batch_script_exports_nothing_of_the_operator_but_the_allow_list(workspace, operator_secrets):
    script = batch_script(JobSpec(name="p", command=["echo", "a"]), "/l")
    assert "#SBATCH --export=NONE" in script.splitlines()
    assert not [value for value in SECRETS.values() if value in script]
    assert "export NCCL_DEBUG=WARN" in script.splitlines() and "unset _var SLURM_EXPORT_ENV" in script


def test_the_batch_scripts_filter_unsets_what_pyslurm_carried(workspace, tmp_path, operator_secrets):
    """The filter the script runs first, run by bash with the operator's variables exported."""
    probe = "\n".join([*shell_filter(slurm=True), "env"])
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True,
                         env={**SECRETS, "PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "NCCL_DEBUG": "WARN"}).stdout
    names = {line.partition("=")[0] for line in out.splitlines()}
    assert not set(SECRETS) & names and {"SLURM_JOB_ID", "NCCL_DEBUG", "PATH"} <= names


def test_a_kubernetes_manifest_refuses_a_secret_variable():
    spec = JobSpec(name="k", command=["echo"], image="img", env={"SSH_AUTH_SOCK": "/tmp/s"})
    with pytest.raises(SchedulerError, match="spec.env names SSH_AUTH_SOCK"):
        job_manifest(spec)
