"""Attacker's tests for tenant isolation (R-SEC-3): a job of tenant B cannot write or prune tenant
A's checkpoints, nor read A's data, whether it asks at submit time or rewrites its own run config
before a requeue. Shared read-only data roots come only from the user's own config."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from trainops.tools.base import ToolError
from trainops.tools.calls import call
from trainops.tools.changes.tenancy import tenant_path, tenant_root
from trainops.tools.context import CallContext

OPERATOR = CallContext(actor="operator")  # mutate tools called by an operator need no approval token
TINY = ["training.seq_len=32", "training.global_batch=2", "training.micro_batch=2"]
TEXT = ("It was the best of times, it was the worst of times. " * 40).encode()


@pytest.fixture(autouse=True)
def user_config(tmp_path, monkeypatch):
    path = tmp_path / "user-config.toml"
    monkeypatch.setenv("TRAINOPS_CONFIG", str(path))
    return path


def _training(tenant: str, *overrides: str, steps: int = 4) -> dict:
    return {"tenant": tenant, "name": f"train-{tenant}",
            "training": {"preset": "tiny", "overrides": [f"training.steps={steps}", *TINY, *overrides]}}


def _a_data() -> Path:
    corpus = tenant_path("team-a", "data") / "corpus.txt"
    corpus.write_bytes(TEXT)
    return corpus


def test_tenant_b_cannot_point_its_checkpoint_folder_at_tenant_a():
    a_checkpoints = tenant_path("team-a", "checkpoints")
    with pytest.raises(ToolError, match=r"R-SEC-3: checkpoint.folder=.*team-a/checkpoints' is outside tenant 'team-b'"):
        call("submit_job", _training("team-b", "checkpoint.enable=true", f"checkpoint.folder={a_checkpoints}"),
             OPERATOR)
    with pytest.raises(ToolError, match=r"R-SEC-3: checkpoint.folder=.* is outside tenant 'team-b'"):
        call("submit_job", _training("team-b", "checkpoint.folder=../../../team-a/checkpoints"), OPERATOR)


def test_tenant_b_cannot_read_tenant_a_data():
    with pytest.raises(ToolError, match=r"R-SEC-3: data.path=.*corpus.txt' resolves to .* outside tenant 'team-b'"):
        call("submit_job", _training("team-b", f"data.path={_a_data()}"), OPERATOR)


def test_a_tenant_job_spec_cannot_use_another_tenants_folders():
    a_run = tenant_path("team-a", "runs") / "r1"
    a_run.mkdir()
    with pytest.raises(ToolError, match=r"R-SEC-3: spec.run_dir=.* is outside tenant 'team-b'"):
        spec = {"name": "sneaky", "command": ["true"], "run_dir": str(a_run)}
        call("submit_job", {"tenant": "team-b", "spec": spec}, OPERATOR)
    with pytest.raises(ToolError, match=r"R-SEC-3: spec.workdir=.* is outside tenant 'team-b'"):
        spec = {"name": "sneaky", "command": ["true"], "workdir": str(a_run), "tenant": "team-b"}
        call("submit_job", {"spec": spec}, OPERATOR)


def test_a_spec_naming_another_tenant_than_the_request_is_refused():
    with pytest.raises(ToolError, match="tenant='team-b' but spec.tenant='team-a': give the tenant once"):
        spec = {"name": "x", "command": ["true"], "tenant": "team-a"}
        call("submit_job", {"tenant": "team-b", "spec": spec}, OPERATOR)


@pytest.mark.parametrize("tenant", ["team-a\n", "../team-a", "team a"])
def test_a_tenant_id_is_matched_in_full(tenant):
    with pytest.raises(ToolError, match="tenant id .* is not valid"):
        call("submit_job", _training(tenant), OPERATOR)


def test_a_shared_data_root_in_a_project_local_file_is_not_trusted(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "corpus.txt").write_bytes(TEXT)
    (tmp_path / "trainops.toml").write_text(f'[governance]\ndata_roots = ["{shared}"]\n')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ToolError, match="data.path=.* outside the workspace"):
        call("submit_job", _training("team-b", f"data.path={shared / 'corpus.txt'}"), OPERATOR)


def _wait_done(job_id: str, timeout_s: float = 240) -> None:
    status = call("wait_job", {"job_id": job_id, "timeout_s": timeout_s})
    logs = call("job_logs", {"job_id": job_id, "tail": 30}).text
    assert (status.state, status.exit_code) == ("completed", 0), logs


@pytest.mark.slow
def test_two_tenants_train_side_by_side_each_in_its_own_root(tmp_path, user_config):
    shared = tmp_path / "shared-data"
    shared.mkdir()
    (shared / "corpus.txt").write_bytes(TEXT)
    user_config.write_text(f'[governance]\ndata_roots = ["{shared}"]\n')
    ckpt = ["checkpoint.enable=true", "checkpoint.interval=2"]
    a = call("submit_job", _training("team-a", *ckpt, f"data.path={_a_data()}"), OPERATOR).handle
    b = call("submit_job", _training("team-b", *ckpt, f"data.path={shared / 'corpus.txt'}"), OPERATOR).handle
    try:
        assert Path(a.run_dir).is_relative_to(tenant_root("team-a").resolve())
        assert Path(b.run_dir).is_relative_to(tenant_root("team-b").resolve())
        a_checkpoints = Path(a.run_dir) / "checkpoints"
        # while both run, B tries A's checkpoint folder and A's data: refused by name
        with pytest.raises(ToolError, match="R-SEC-3: checkpoint.folder=.* is outside tenant 'team-b'"):
            call("submit_job", _training("team-b", *ckpt, f"checkpoint.folder={a_checkpoints}"), OPERATOR)
        with pytest.raises(ToolError, match="R-SEC-3: data.path=.* outside tenant 'team-b'"):
            call("submit_job", _training("team-b", f"data.path={_a_data()}"), OPERATOR)
        _wait_done(a.job_id)
        _wait_done(b.job_id)
    finally:
        for job in (a, b):
            call("cancel_job", {"job_id": job.job_id, "force": True}, OPERATOR)
    for handle in (a, b):
        listed = call("list_checkpoints", {"folder": str(Path(handle.run_dir) / "checkpoints")})
        assert listed.newest_committed_step == 4
    # B rewrites its own run config to prune A's checkpoints on the next launch: the requeue is refused
    b_config = Path(b.run_dir) / "config.toml"
    b_config.write_text(b_config.read_text().replace('folder = "checkpoints"', f'folder = "{a_checkpoints}"'))
    before = sorted(p.name for p in a_checkpoints.iterdir())
    with pytest.raises(ToolError, match=f"refusing to relaunch job {b.job_id}: R-SEC-3: checkpoint.folder="):
        call("requeue_job", {"job_id": b.job_id}, OPERATOR)
    time.sleep(0.2)
    assert sorted(p.name for p in a_checkpoints.iterdir()) == before
