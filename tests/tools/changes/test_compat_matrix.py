"""Issue 26 item 4: the compatibility matrix is data shipped in the package, an upgrade outside it
is refused naming the pair, and a launch reads the tenant's pin and the matrix before it runs."""
from __future__ import annotations

import json
import sys
import tomllib
from fnmatch import fnmatch
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.cli import app
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.changes.compat import Environment, check, installed_environment, load_matrix
from trainops.tools.changes.tenancy import tenant_root
from trainops.tools.context import CallContext
from trainops.tools.governance.gate import GateRefused

runner = CliRunner()
OPERATOR = CallContext(actor="operator")
REPO = Path(__file__).resolve().parents[3]


def _pin(tenant: str, pins: dict) -> None:
    path = tenant_root(tenant) / "framework.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(pins))


def _plain_job(tenant: str) -> dict:
    return {"scheduler": "local", "tenant": tenant,
            "spec": {"name": "compat-probe", "command": [sys.executable, "-c", "pass"]}}


def test_the_shipped_matrix_loads_from_the_installed_package_and_names_its_sources():
    shipped = resources.files("trainops.tools.changes").joinpath("compat_matrix.json")
    assert shipped.is_file()
    matrix = load_matrix()
    assert {row.torch for row in matrix.torch} >= {"2.4", "2.9", "2.13"}
    assert all(row.source for row in [*matrix.torch, *matrix.frameworks])
    assert {(row.torch, row.cuda, row.nccl) for row in matrix.nccl} >= {("2.6", "12.4", "2.21.5"),
                                                                      ("2.8", "12.8", "2.27.3")}
    assert all("Requires-Dist nvidia-nccl-cu" in row.source for row in matrix.nccl)
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert any(fnmatch("compat_matrix.json", pattern) for pattern in data["trainops.tools.changes"]), "not in the wheel"


def test_bad_matrix_data_is_one_error_naming_the_file_and_the_field(tmp_path):
    bad = json.loads(resources.files("trainops.tools.changes").joinpath("compat_matrix.json").read_text())
    bad["torch"][2]["cuda"] = "12.4"
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"matrix\.json: field torch\.2\.cuda: .*fix that entry"):
        load_matrix(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"matrix\.json cannot be read"):
        load_matrix(path)


def test_check_names_each_incompatible_pair_and_reports_unknown_versions():
    assert check(installed_environment(("deepspeed", "megatron-core"))).problems == []  # this machine
    (pair,) = check(Environment(torch="2.13.0", cuda="11.8")).problems
    assert pair.startswith("torch 2.13.0 with CUDA 11.8: not a published pair") and "source " in pair
    (cuda,) = check(Environment(torch="2.7.1", cuda="12.4")).problems
    assert "torch 2.7 ships CUDA 11.8/12.6/12.8" in cuda
    report = check(Environment(torch="2.5.1", cuda="12.4", nccl="2.21.5",
                               frameworks={"megatron-core": "0.16.1", "torchtitan": "0.2.0"}))
    assert any("megatron-core 0.16.1 with torch 2.5.1: not a published pair" in p and "torch>=2.6.0" in p
               for p in report.problems)
    assert any(p.startswith("torchtitan 0.2.0: not in the matrix") and "torchtitan 0.3.0" in p for p in report.problems)
    (titan,) = check(Environment(torch="2.13.0", frameworks={"torchtitan": "0.3.0"})).problems  # pinned to 2.14
    assert "torchtitan 0.3.0 with torch 2.13.0: not a published pair" in titan and "torch>=2.14.0,<2.15.0" in titan
    at_214 = check(Environment(torch="2.14.0", frameworks={"torchtitan": "0.3.0"})).problems
    assert not [p for p in at_214 if "torchtitan" in p]  # the pair holds (torch 2.14 itself has no row yet)
    assert report.unchecked == []  # torch 2.5's CUDA 12.4 wheel pins NCCL 2.21.5: a published triple
    assert check(Environment(torch="3.1.0")).problems[0].startswith("torch 3.1.0: not in the matrix")
    newer = check(Environment(torch="2.13.0", cuda="12.8"))  # 2.13's CUDA list is not recorded: said, not passed
    assert newer.problems == [] and newer.unchecked[0].endswith("records no CUDA builds of torch 2.13, not checked")


def test_an_upgrade_to_a_torch_without_a_wheel_for_the_pinned_cuda_is_refused_through_the_cli():
    _pin("acme", {"torch": "2.6.0", "cuda": "12.4"})
    upgrade = {"tenant": "acme", "framework": "torch", "from_version": "2.6.0", "to_version": "2.7.0"}
    result = runner.invoke(app, ["tool", "call", "upgrade_framework", "--input", json.dumps(upgrade), "--json"])
    assert result.exit_code != 0
    error = json.loads(result.stdout)["error"]
    assert "torch 2.7.0 with CUDA 12.4: not a published pair" in error and "ships CUDA 11.8/12.6/12.8" in error


def test_an_upgrade_that_breaks_an_adapter_frameworks_torch_requirement_is_refused():
    _pin("acme", {"torch": "2.6.0", "megatron-core": "0.16.1"})
    with pytest.raises(GateRefused, match=r"megatron-core 0.16.1 with torch 2.5.0: not a published pair"):
        call("upgrade_framework", {"tenant": "acme", "framework": "torch", "from_version": "2.6.0",
                                   "to_version": "2.5.0"})
    with pytest.raises(GateRefused, match=r"deepspeed 0.20.0: not in the matrix"):
        call("upgrade_framework", {"tenant": "acme", "framework": "deepspeed", "from_version": "0.19.8",
                                   "to_version": "0.20.0"})


def test_the_one_minor_step_and_forced_cross_version_rules_still_hold():
    upgrade = {"tenant": "acme", "framework": "torch", "from_version": "2.12.0", "to_version": "2.14.0"}
    with pytest.raises(GateRefused, match="one minor version at a time"):
        call("upgrade_framework", upgrade)
    with pytest.raises(GateRefused, match="forbidden"):
        call("upgrade_framework", {**upgrade, "force": True})


def test_a_launch_whose_pinned_versions_form_a_pair_outside_the_matrix_is_refused():
    _pin("acme", {"torch": "2.13.0", "cuda": "11.8"})
    with pytest.raises(ToolError, match=r"outside the compatibility matrix: torch 2.13.0 with CUDA 11.8: not a "
                                        r"published pair"):
        call("submit_job", _plain_job("acme"), OPERATOR)


def test_a_tenant_job_launched_with_a_version_other_than_its_pin_is_refused_naming_both():
    _pin("acme", {"torch": "2.12.0"})
    with pytest.raises(ToolError, match=r"tenant 'acme' pins torch 2.12.0 but this launch runs torch 2.13.0"):
        call("submit_job", _plain_job("acme"), OPERATOR)


def test_a_tenant_job_matching_its_pin_launches():
    _pin("acme", {"torch": "2.13.0"})
    handle = call("submit_job", _plain_job("acme"), OPERATOR).handle
    status = call("wait_job", {"job_id": handle.job_id, "timeout_s": 60}, OPERATOR)
    assert status.state == "completed"


def test_a_launch_through_the_cli_is_refused_for_a_pin_the_installed_version_breaks():
    _pin("acme", {"torch": "2.13.0", "megatron-core": "0.15.0"})
    result = runner.invoke(app, ["tool", "call", "submit_job", "--input", json.dumps(_plain_job("acme")), "--json"])
    assert result.exit_code != 0
    assert "megatron-core 0.15.0: not in the matrix" in json.loads(result.stdout)["error"]


def test_a_requeue_after_the_pin_moved_is_refused_naming_the_pin():
    _pin("acme", {"torch": "2.13.0"})
    handle = call("submit_job", _plain_job("acme"), OPERATOR).handle
    call("wait_job", {"job_id": handle.job_id, "timeout_s": 60}, OPERATOR)
    _pin("acme", {"torch": "2.12.0"})
    with pytest.raises(ToolError, match=r"refusing to relaunch .*pins torch 2.12.0 but this launch runs torch 2.13"):
        call("requeue_job", {"job_id": handle.job_id}, OPERATOR)


def test_an_nccl_other_than_the_one_its_torch_cuda_wheel_pins_is_named_and_an_unknown_triple_is_said():
    (pair,) = check(Environment(torch="2.8.0", cuda="12.8", nccl="2.21.5")).problems
    assert pair.startswith("NCCL 2.21.5 with torch 2.8.0 and CUDA 12.8: not a published pair; torch 2.8's CUDA "
                           "12.8 wheel pins NCCL 2.27.3 (source torch 2.8.0 manylinux x86_64 wheel on PyPI")
    unknown = check(Environment(torch="2.7.1", cuda="11.8", nccl="2.21.5"))
    assert unknown.problems == [] and unknown.unchecked == [
        "NCCL 2.21.5 with torch 2.7.1 and CUDA 11.8: the matrix records no NCCL pin for that wheel, not checked"]


def test_a_launch_whose_pinned_nccl_breaks_its_torch_cuda_triple_is_refused_through_the_cli():
    _pin("acme", {"torch": "2.8.0", "cuda": "12.8", "nccl": "2.21.5"})
    result = runner.invoke(app, ["tool", "call", "submit_job", "--input", json.dumps(_plain_job("acme")), "--json"])
    assert result.exit_code != 0
    assert "NCCL 2.21.5 with torch 2.8.0 and CUDA 12.8: not a published pair" in json.loads(result.stdout)["error"]


def test_a_torch_upgrade_that_leaves_the_pinned_nccl_behind_is_refused_naming_the_triple():
    _pin("acme", {"torch": "2.8.0", "cuda": "12.8", "nccl": "2.27.3"})
    upgrade = {"tenant": "acme", "framework": "torch", "from_version": "2.8.0", "to_version": "2.9.0"}
    result = runner.invoke(app, ["tool", "call", "upgrade_framework", "--input", json.dumps(upgrade), "--json"])
    assert result.exit_code != 0
    error = json.loads(result.stdout)["error"]
    assert "NCCL 2.27.3 with torch 2.9.0 and CUDA 12.8: not a published pair" in error and "pins NCCL 2.27.5" in error
