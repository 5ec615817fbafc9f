"""A run folder is made in one place, `trainops.run_folder.new_run_folder`: its id, its logs/ and its
config.toml. Every launcher (the trainer, the job tools, the framework adapters, the SDC check) goes
through it, and a test reads the product's source to keep it so."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import trainops
from trainops.run_folder import RunFiles, new_run_folder
from trainops.workspace import runs_dir

REPO = Path(trainops.__file__).resolve().parents[1]
PRODUCT = ("agents", "benchmarks", "skills", "tools", "trainer", "trainops")
OWNER = REPO / "trainops" / "run_folder.py"
RUN_FOLDER_WORDS = ("runs_dir()", "logs_dir", "'logs'", "'runs'", "run_id")


def folder_makers(source: str) -> list[str]:
    """The `.mkdir()` calls of `source` on a run folder or its logs/ (their receiver, as written)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "mkdir":
            receiver = ast.unparse(node.func.value)
            if any(word in receiver for word in RUN_FOLDER_WORDS):
                found.append(receiver)
    return found


def test_no_product_module_but_run_folder_makes_a_run_folder():
    makers = {f"{path.relative_to(REPO)}: {receiver}" for folder in PRODUCT for path in (REPO / folder).rglob("*.py")
              if path != OWNER for receiver in folder_makers(path.read_text(encoding="utf-8"))}
    assert makers == set(), "make run folders with trainops.run_folder.new_run_folder"


def test_no_product_module_names_a_new_run_id_of_its_own():
    """The id of a new run is new_run_folder's to choose (a caller may pass one, as `--run-id` does)."""
    spelled = {str(path.relative_to(REPO)) for folder in PRODUCT for path in (REPO / folder).rglob("*.py")
               if "new_run_id" in path.read_text(encoding="utf-8")}
    assert spelled == set()


@pytest.mark.parametrize("line", ['RunFiles(run_dir).logs_dir.mkdir(parents=True)',
                                  "(folder / 'logs').mkdir(parents=True)", "(runs_dir() / run).mkdir()",
                                  "(tenant_path(t, 'runs') / run_id).mkdir(parents=True)"])
def test_the_check_sees_each_way_a_run_folder_was_made_before(line):
    assert folder_makers(line)


def test_a_new_run_folder_has_its_logs_and_config_under_the_workspace_runs():
    run_dir = new_run_folder("[training]\nsteps = 1\n")
    assert run_dir.parent == runs_dir() and run_dir.name.startswith("run-")
    assert RunFiles(run_dir).logs_dir.is_dir() and RunFiles(run_dir).config.read_text() == "[training]\nsteps = 1\n"


def test_a_tenant_run_folder_lies_in_the_root_it_is_given(tmp_path):
    run_dir = new_run_folder(None, tmp_path / "tenants" / "acme" / "runs", prefix="sdc-fleet")
    assert run_dir.parent == tmp_path / "tenants" / "acme" / "runs" and run_dir.name.startswith("sdc-fleet-")
    assert not RunFiles(run_dir).config.exists()


def test_a_run_id_that_exists_is_refused_and_one_that_is_no_folder_name_too():
    new_run_folder("", run_id="kept")
    with pytest.raises(ValueError, match="run id 'kept' already exists"):
        new_run_folder("", run_id="kept")
    with pytest.raises(ValueError, match="run id '../out' is not valid"):
        new_run_folder("", run_id="../out")


def test_a_path_the_check_refuses_leaves_no_folder():
    def refuse(path: Path) -> None:
        raise ValueError(f"{path} refused")

    with pytest.raises(ValueError, match="refused"):
        new_run_folder("", check=refuse)
    assert list(runs_dir().iterdir()) == []
