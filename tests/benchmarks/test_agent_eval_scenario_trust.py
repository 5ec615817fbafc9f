"""A scenario cannot reach outside itself (issue 41, class 6): its workspace holds only regular files
and folders, each size-capped (a link handed the approver's key to the model, /dev/zero exhausted
memory, a FIFO hangs), refused by `eval run` naming the path; `eval record` names are slugs and
--overwrite removes only that scenario's own folder inside --dest."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainops.benchmarks.agent_eval.scenario import SCENARIOS_DIR, load, materialize
from trainops.cli import app

PLAIN = "crash-what-happened"


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _scenario_copy(tmp_path: Path, name: str = PLAIN) -> Path:
    folder = tmp_path / "scenarios" / name
    shutil.copytree(SCENARIOS_DIR / name, folder)
    return folder


SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- approver"


@pytest.mark.parametrize("plant", ["symlink to a key", "symlink to /dev/zero", "symlinked folder", "fifo",
                                   "oversized file"])
def test_eval_run_refuses_a_scenario_workspace_with_anything_but_regular_files_and_folders(tmp_path, workspace,
                                                                                           plant):
    folder = _scenario_copy(tmp_path)
    secret = tmp_path / "approver" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text(SECRET)
    logs = next((folder / "workspace" / "runs").iterdir()) / "logs"
    bad = logs / "rank2.log"
    if plant == "symlink to a key":
        bad.symlink_to(secret)
    elif plant == "symlink to /dev/zero":
        bad.symlink_to("/dev/zero")
    elif plant == "symlinked folder":
        bad = logs / "keys"
        bad.symlink_to(secret.parent, target_is_directory=True)
    elif plant == "fifo":
        os.mkfifo(bad)
    else:
        bad.write_bytes(b"x" * (1024 * 1024 + 1))
    result = _cli("eval", "run", "--scenarios", str(folder.parent), "--k", "1", "--json")
    assert result.exit_code != 0 and str(bad.relative_to(folder)) in result.output, result.output
    assert SECRET not in result.output


def test_materialize_copies_no_link_even_when_one_appears_after_the_scenario_was_loaded(tmp_path):
    folder = _scenario_copy(tmp_path)
    scenario = load(folder)
    secret = tmp_path / "id_ed25519"
    secret.write_text(SECRET)
    (next((folder / "workspace" / "runs").iterdir()) / "logs" / "rank2.log").symlink_to(secret)
    with pytest.raises(ValueError, match="rank2.log"):
        materialize(scenario, tmp_path / "home")
    assert SECRET not in "".join(p.read_text() for p in (tmp_path / "home").rglob("*") if p.is_file())


def _record(source: Path, dest: Path, name: str, *extra: str):
    return _cli("eval", "record", str(source), "--name", name, "--request", "What happened?", "--tag", "easy",
                "--dest", str(dest), *extra)


@pytest.mark.parametrize("name", ["", "../x", "a/b", "{tmp}/abs", ".", "..", "Crash", "x" * 65, "-x"])
def test_record_refuses_a_name_that_is_not_a_slug_and_touches_nothing(tmp_path, name):
    name = name.format(tmp=tmp_path)
    source = materialize(load(SCENARIOS_DIR / PLAIN), tmp_path / "source-home")
    dest = tmp_path / "scenarios"
    shutil.copytree(SCENARIOS_DIR / PLAIN, dest / "kept")
    result = _record(source, dest, name, "--overwrite")
    assert result.exit_code != 0 and "name" in result.output and "e.g." in result.output, result.output
    assert (dest / "kept" / "scenario.toml").is_file() and sorted(p.name for p in dest.iterdir()) == ["kept"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scenarios", "source-home"]


def test_record_overwrite_replaces_only_that_scenario_and_never_a_folder_that_is_not_one(tmp_path):
    source = materialize(load(SCENARIOS_DIR / PLAIN), tmp_path / "source-home")
    dest = tmp_path / "scenarios"
    shutil.copytree(SCENARIOS_DIR / PLAIN, dest / "kept")
    assert _record(source, dest, "again").exit_code == 0
    assert _record(source, dest, "again", "--overwrite").exit_code == 0
    assert sorted(p.name for p in dest.iterdir()) == ["again", "kept"]
    (dest / "notes").mkdir()
    (dest / "notes" / "todo.txt").write_text("mine")
    result = _record(source, dest, "notes", "--overwrite")
    assert result.exit_code != 0 and "scenario.toml" in result.output, result.output
    assert (dest / "notes" / "todo.txt").read_text() == "mine"
    (dest / "linked").symlink_to(dest / "kept", target_is_directory=True)
    result = _record(source, dest, "linked", "--overwrite")
    assert result.exit_code != 0 and (dest / "kept" / "scenario.toml").is_file(), result.output
