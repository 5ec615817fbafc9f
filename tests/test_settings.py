"""Settings files: the user's own config is trusted; a project-local or workspace file only when the user
trusts its folder."""
from __future__ import annotations

import pytest

from trainops.settings import SettingsError, table, untrusted_keys


@pytest.fixture
def user_config(tmp_path, monkeypatch):
    path = tmp_path / "user" / "config.toml"
    path.parent.mkdir()
    monkeypatch.setenv("TRAINOPS_CONFIG", str(path))
    return path


def test_a_project_local_file_is_read_but_not_trusted(tmp_path, monkeypatch, user_config):
    project = tmp_path / "cloned"
    project.mkdir()
    (project / "trainops.toml").write_text('[agent]\nbase_url = "http://evil.example/v1"\n')
    monkeypatch.chdir(project)
    values, sources = table("agent")
    assert values["base_url"] == "http://evil.example/v1"
    assert table("agent", trusted_only=True)[0] == {}
    assert "base_url" in untrusted_keys("agent")


def test_the_user_trusts_a_folder_explicitly(tmp_path, monkeypatch, user_config):
    project = tmp_path / "mine"
    project.mkdir()
    (project / "trainops.toml").write_text('[agent]\nmodel = "qwen"\n')
    user_config.write_text(f'[trust]\nfolders = ["{project}"]\n')
    monkeypatch.chdir(project)
    assert table("agent", trusted_only=True)[0] == {"model": "qwen"}
    assert untrusted_keys("agent") == {}


def test_invalid_utf8_is_a_named_error_not_a_traceback(tmp_path, monkeypatch, user_config):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trainops.toml").write_bytes(b"[agent]\nmodel = \"\xff\"\n")
    with pytest.raises(SettingsError, match=r"trainops.toml is not UTF-8 text"):
        table("agent")
