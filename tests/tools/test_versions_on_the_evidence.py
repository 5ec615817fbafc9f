"""Versions on the evidence (issue 39, item 6): the pack and every tool output, as it leaves
trainops (the CLI's `tool call`, the agent's LangChain tools), carry trainops' version, its git
commit where it runs from a checkout (none from an installed wheel, without failing), torch's and
the scheduler's."""
from __future__ import annotations

import json
import re
from importlib.metadata import version

from typer.testing import CliRunner

from trainops.cli import app
from trainops.skills.evidence.model import PackEnvironment
from trainops.skills.evidence.pack import assemble
from trainops.tools import versions
from trainops.tools.langchain import as_langchain_tools

PLAN = {"save_s": 300, "restart_s": 600, "mtbf_h": 6}


def _checked(stamp: dict) -> None:
    assert stamp["trainops"] == version("trainops") and stamp["torch"] == version("torch")
    assert re.fullmatch(r"[0-9a-f]{40}", stamp["trainops_commit"])  # the tests run from the git checkout
    assert stamp["scheduler"].startswith("local")


def test_the_versions_name_trainops_its_commit_torch_and_the_scheduler():
    _checked(versions.current("local").model_dump())


def test_an_installed_wheel_has_no_commit_and_does_not_fail(monkeypatch, tmp_path):
    monkeypatch.setattr(versions, "source_root", lambda: tmp_path)  # site-packages: no .git beside the package
    versions.current.cache_clear()
    try:
        stamp = versions.current("local")
    finally:
        versions.current.cache_clear()
    assert stamp.trainops_commit is None and stamp.trainops == version("trainops")


def test_a_tool_called_from_the_cli_carries_the_versions(workspace):
    result = CliRunner().invoke(app, ["tool", "call", "plan_checkpoint_interval", "--input", json.dumps(PLAN),
                                      "--json"])
    assert result.exit_code == 0, result.output
    _checked(json.loads(result.stdout)["versions"])


def test_a_tool_the_agent_calls_carries_the_versions(workspace):
    (plan,) = as_langchain_tools(["plan_checkpoint_interval"])
    _checked(plan.invoke(PLAN)["versions"])


def test_the_pack_carries_the_versions_of_the_run(workspace):
    env = PackEnvironment(framework="trainops-trainer", framework_version="0.1.0", torch_version="2.13.0",
                          hardware="cpu:x86_64", device_count=2, backend="gloo", scheduler="local")
    pack = assemble("pack-v", env, None, [], [], [])
    assert pack.versions.torch == "2.13.0" and pack.versions.scheduler == "local"  # the environment's, as declared
    assert pack.versions.trainops == version("trainops") and pack.versions.trainops_commit
    assert json.loads(pack.model_dump_json())["versions"]["trainops"] == version("trainops")
