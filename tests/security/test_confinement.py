"""Attacker's tests: every path a tool reads or writes resolves (symlinks included) inside the
workspace or a root the user's own config lists; ids are matched in full; sizes and waits are
bounded. The attacker controls what a job writes (its run folder) and what a model asks for."""
from __future__ import annotations

import json
import os

import pytest

from trainops.settings import SettingsError
from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.context import CallContext
from trainops.trainer.checkpoint_files import COMMIT_FILE, step_dir_name
from trainops.workspace import check_id, confine

OPERATOR = CallContext(actor="operator")  # mutate tools called by an operator need no approval token


@pytest.fixture(autouse=True)
def user_config(tmp_path, monkeypatch):
    """The human's own settings file (trusted), empty unless a test writes it."""
    path = tmp_path / "user-config.toml"
    monkeypatch.setenv("TRAINOPS_CONFIG", str(path))
    return path


@pytest.fixture
def outside(tmp_path):
    """A folder outside the workspace holding a file the attacker wants to damage or read."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.bin").write_bytes(bytes(4096))
    return folder


@pytest.mark.parametrize("kind", ["run", "pack", "job", "tenant"])
@pytest.mark.parametrize("value", ["r1\n", "r1\nx", "../r1", ".hidden", "a/b", ""])
def test_an_id_is_matched_in_full(kind, value):
    with pytest.raises(ValueError, match=f"{kind} id .* is not valid"):
        check_id(kind, value)


def test_a_symlink_out_of_the_workspace_is_resolved_and_refused(workspace, outside):
    workspace.mkdir(parents=True)
    (workspace / "link").symlink_to(outside)
    with pytest.raises(ValueError, match=r"folder='.*link' resolves to .*outside, outside the workspace .* fix:"):
        confine(workspace / "link", "folder")
    assert confine(workspace / "runs" / "new", "folder") == (workspace / "runs" / "new").resolve()


def test_a_root_listed_in_the_users_config_is_allowed(outside, user_config):
    user_config.write_text(f'[governance]\nroots = ["{outside}"]\n')
    assert confine(outside / "precious.bin", "path") == outside / "precious.bin"


@pytest.mark.parametrize("roots", ['"/data"', '["relative/folder"]', '[""]'])
def test_configured_roots_must_be_a_list_of_absolute_folders(user_config, roots):
    user_config.write_text(f"[governance]\nroots = {roots}\n")
    must = r"\[governance\] roots in .*user-config.toml must be a list of absolute folder paths"
    with pytest.raises(SettingsError, match=must):
        confine("anything", "path")


def test_a_root_listed_in_a_project_local_file_is_not_trusted(tmp_path, outside, monkeypatch):
    project = tmp_path / "cloned"
    project.mkdir()
    (project / "trainops.toml").write_text(f'[governance]\nroots = ["{outside}"]\n')
    monkeypatch.chdir(project)
    with pytest.raises(ValueError, match="outside the workspace"):
        confine(outside / "precious.bin", "path")


def _poisoned_checkpoint(workspace, outside):
    """Run 'ck' whose newest committed checkpoint's only data file is a symlink to a file outside."""
    step = workspace / "runs" / "ck" / "checkpoints" / step_dir_name(4)
    step.mkdir(parents=True)
    (step / "__0_0.distcp").symlink_to(outside / "precious.bin")
    (step / COMMIT_FILE).write_text(json.dumps({"step": 4, "time": 1.0}))


def test_corrupt_checkpoint_does_not_follow_a_symlinked_file_out_of_the_workspace(workspace, outside):
    _poisoned_checkpoint(workspace, outside)
    with pytest.raises(ToolError, match=r"checkpoint file=.* resolves to .*precious.bin, outside the workspace"):
        call("inject_fault", {"kind": "corrupt_checkpoint", "run": "ck"}, OPERATOR)
    assert (outside / "precious.bin").read_bytes() == bytes(4096)


def test_corrupt_checkpoint_does_not_follow_a_symlinked_checkpoints_folder(workspace, outside):
    (outside / step_dir_name(4)).mkdir()
    (outside / step_dir_name(4) / "__0_0.distcp").write_bytes(bytes(4096))
    (workspace / "runs" / "ck").mkdir(parents=True)
    (workspace / "runs" / "ck" / "checkpoints").symlink_to(outside)
    with pytest.raises(ToolError, match="checkpoint folder=.* outside the workspace"):
        call("inject_fault", {"kind": "corrupt_checkpoint", "run": "ck"}, OPERATOR)
    assert (outside / step_dir_name(4) / "__0_0.distcp").read_bytes() == bytes(4096)


def test_the_fault_record_is_not_written_through_a_link_the_job_planted(workspace, outside):
    (workspace / "runs" / "ck" / "checkpoints" / step_dir_name(4)).mkdir(parents=True)
    (workspace / "runs" / "ck" / "checkpoints" / step_dir_name(4) / "__0_0.distcp").write_bytes(bytes(100))
    (workspace / "runs" / "ck" / "checkpoints" / step_dir_name(4) / "COMMIT.json").write_text('{"time": 1.0}')
    (workspace / "runs" / "ck" / "faults.jsonl").symlink_to(outside / "precious.bin")
    with pytest.raises(ToolError, match="cannot append to .*faults.jsonl .* must be a plain file"):
        call("inject_fault", {"kind": "corrupt_checkpoint", "run": "ck"}, OPERATOR)
    assert (outside / "precious.bin").read_bytes() == bytes(4096)


def test_a_run_named_by_a_symlink_in_runs_is_refused(workspace, outside):
    (workspace / "runs").mkdir(parents=True)
    (workspace / "runs" / "sneaky").symlink_to(outside)
    for tool, inp in [("summarize_run", {"run": "sneaky"}), ("detect_faults", {"run": "sneaky", "timeout_s": 0.1}),
                      ("query_metrics", {"run": "sneaky", "metric": "loss"})]:
        with pytest.raises(ToolError, match=r"run='.*sneaky' resolves to .*outside, outside the workspace"):
            call(tool, inp)
    for tool in ("list_checkpoints", "verify_checkpoint"):
        with pytest.raises(ToolError, match=r"run checkpoints=.* resolves to .*outside/checkpoints, outside the"):
            call(tool, {"run": "sneaky"})


@pytest.mark.parametrize("tool, inp", [
    ("list_checkpoints", {"folder": "{outside}"}),
    ("verify_checkpoint", {"path": "{outside}"}),
    ("measure_checkpoint_io", {"size_mib": 1, "tensors": 1, "folder": "{outside}"}),
    ("declare_environment", {"ckpt_dir": "{outside}", "ckpt_test_mib": 1, "measure_gemm": False}),
])
def test_read_tools_refuse_a_folder_outside_the_workspace_and_write_nothing_there(tool, inp, outside):
    before = sorted(os.listdir(outside))
    with pytest.raises(ToolError, match=r"resolves to .*outside, outside the workspace .* \[governance\] roots"):
        call(tool, json.loads(json.dumps(inp).replace("{outside}", str(outside))))
    assert sorted(os.listdir(outside)) == before


def test_measure_checkpoint_io_writes_only_a_temporary_folder_it_removes(workspace, outside, user_config):
    user_config.write_text(f'[governance]\nroots = ["{outside}"]\n')
    out = call("measure_checkpoint_io", {"size_mib": 1, "tensors": 1, "folder": str(outside)})
    assert out.folder == str(outside) and sorted(os.listdir(outside)) == ["precious.bin"]


@pytest.mark.parametrize("spec_field", ["run_dir", "workdir"])
def test_submit_job_refuses_a_job_folder_outside_the_workspace(spec_field, outside):
    spec = {"name": "escape", "command": ["true"], spec_field: str(outside)}
    with pytest.raises(ToolError, match=f"spec.{spec_field}=.* outside the workspace"):
        call("submit_job", {"spec": spec}, OPERATOR)


@pytest.mark.parametrize("override, field", [
    ("checkpoint.folder={outside}", "checkpoint.folder"),
    ("checkpoint.folder=../../../outside", "checkpoint.folder"),
    ("data.path={outside}/precious.bin", "data.path"),
    ("model.init_from={outside}", "model.init_from"),
])
def test_a_training_run_cannot_write_checkpoints_or_read_data_outside_the_workspace(workspace, override, field,
                                                                                    outside):
    training = {"preset": "tiny", "overrides": ["checkpoint.enable=true", override.format(outside=outside)]}
    with pytest.raises(ToolError, match=f"{field}=.* outside the workspace"):
        call("submit_job", {"training": training}, OPERATOR)
    assert not list((workspace / "runs").glob("run-*")), "a refused run leaves no run folder"


def test_requeue_checks_the_config_the_job_may_have_rewritten(workspace, outside):
    job = call("submit_job", {"training": {"preset": "tiny", "overrides": ["training.steps=1"]}}, OPERATOR).handle
    call("cancel_job", {"job_id": job.job_id, "force": True}, OPERATOR)
    config = workspace / "runs" / os.path.basename(job.run_dir) / "config.toml"
    config.write_text(config.read_text().replace('folder = "checkpoints"', f'folder = "{outside}"'))
    refused = f"refusing to relaunch job {job.job_id}: checkpoint.folder=.* outside the workspace"
    with pytest.raises(ToolError, match=refused):
        call("requeue_job", {"job_id": job.job_id}, OPERATOR)


def test_job_logs_do_not_follow_a_log_the_job_replaced_with_a_link(workspace, outside):
    (outside / "secret.txt").write_text("api-key=hunter2\n")
    run_dir = workspace / "runs" / "leaky"
    run_dir.mkdir(parents=True)
    job = call("submit_job", {"spec": {"name": "leaky", "command": ["true"], "run_dir": str(run_dir)}}, OPERATOR).handle
    call("wait_job", {"job_id": job.job_id, "timeout_s": 30})
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "rank0.log").symlink_to(outside / "secret.txt")
    with pytest.raises(ToolError, match="rank 0 log=.* resolves to .*secret.txt, outside the workspace"):
        call("job_logs", {"job_id": job.job_id, "rank": 0})
    os.replace(job.log_path, str(job.log_path) + ".old")
    os.symlink(outside / "secret.txt", job.log_path)
    with pytest.raises(ToolError, match="job log=.* outside the workspace"):
        call("job_logs", {"job_id": job.job_id})


@pytest.mark.parametrize("tool, inp, field", [
    ("wait_job", {"job_id": "j1", "timeout_s": float("inf")}, "timeout_s"),
    ("wait_job", {"job_id": "j1", "timeout_s": 10**9}, "timeout_s"),
    ("detect_faults", {"run": "r", "timeout_s": float("nan")}, "timeout_s"),
    ("detect_faults", {"run": "r", "heartbeat_stale_s": float("inf")}, "heartbeat_stale_s"),
    ("measure_checkpoint_io", {"size_mib": 1 << 20}, "size_mib"),
    ("declare_environment", {"ckpt_test_mib": 1 << 20}, "ckpt_test_mib"),
    ("job_logs", {"job_id": "j1", "tail": 10**9}, "tail"),
    ("query_metrics", {"run": "r", "metric": "loss", "window_s": float("inf")}, "window_s"),
    ("inject_fault", {"kind": "straggler", "slow_ms": 10**9}, "slow_ms"),
    ("submit_job", {"training": {"preset": "tiny", "nproc": 10**6}}, "training.nproc"),
])
def test_sizes_and_waits_are_finite_and_bounded(tool, inp, field):
    with pytest.raises(ToolError, match=f"{tool}: invalid input: {field}:"):
        call(tool, inp, OPERATOR)
