"""trainops installs as one product: one import namespace, every file it reads shipped inside the
wheel, and a wheel installed into a fresh environment outside the repository works."""
from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT_FOLDERS = {"trainops": "trainops", "trainops.agents": "agents", "trainops.skills": "skills",
                "trainops.tools": "tools", "trainops.trainer": "trainer", "trainops.benchmarks": "benchmarks"}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_package_folder_is_listed_under_the_trainops_namespace():
    settings = _pyproject()["tool"]["setuptools"]
    assert settings["package-dir"] == ROOT_FOLDERS
    on_disk = set()
    for package, folder in ROOT_FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder).parts
            on_disk.add(".".join((package, *relative)))
    assert set(settings["packages"]) == on_disk


def test_runtime_imports_are_all_declared_dependencies():
    """skills_ref is read at run time (skill list, the agent's prompt): a plain install needs it."""
    deps = " ".join(_pyproject()["project"]["dependencies"])
    for needed in ("skills-ref", "pydantic", "typer", "rich", "langgraph", "torch", "cryptography", "jinja2",
                   "markdown-it-py"):
        assert needed in deps


def test_no_module_imports_a_bare_root_folder_name():
    """`import tools` would pick up whatever `tools` comes first on a user's sys.path."""
    offenders = []
    for path in REPO.rglob("*.py"):
        if {".venv", ".git", "build"} & set(path.parts):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            stripped = line.strip()
            for name in ("tools", "agents", "skills", "trainer", "benchmarks"):
                if stripped.startswith((f"from {name} ", f"from {name}.", f"import {name}")):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {stripped}")
    assert not offenders, "\n".join(offenders)


def _run(command: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n"
                                  f"{done.stderr[-3000:]}")
    return done


# wheels are built from a copy, so setuptools' build/ and egg-info folders never land in the checkout
NOT_SOURCE = shutil.ignore_patterns(".venv", ".git", ".trainops", "build", "*.egg-info", "__pycache__", ".*_cache",
                                    "tests")


def _data_files_on_disk() -> set[str]:
    """Every file of the package folders that is not Python, named as it lies in the wheel."""
    found = set()
    for package, folder in ROOT_FOLDERS.items():
        root = REPO / folder
        for path in root.rglob("*"):
            relative = path.relative_to(root).parts
            if path.is_file() and path.suffix not in (".py", ".pyc") and not any(
                    part.startswith(".") or part == "__pycache__" for part in relative):
                found.add("/".join((*package.split("."), *relative)))
    return found


COPY_LINE = re.compile(r"(creating|copying|adding) ")


def test_the_wheel_builds_without_a_warning_and_carries_every_data_file(tmp_path):
    """A newcomer's first `make demo` shows no setuptools warnings, and no file the code reads
    (AGENTS.md, the SKILL.md files, the schema, templates, text, RESULTS.md, gpu.sh) is left out.
    Built offline with this environment's setuptools, verbose, so the backend's warnings are in the log."""
    source, wheels = tmp_path / "source", tmp_path / "wheels"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    # without byte-compiling, setuptools warns that it skips it: a note about this shell, not the project
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-v",
                  "-w", str(wheels), str(source)], source, env)
    warned = [line.strip() for line in (built.stdout + built.stderr).splitlines()
              if ("warning" in line.lower() and not COPY_LINE.match(line.strip()))  # not oc-*-warnings
              or "is absent from the `packages`" in line]
    assert not warned, "the build warns:\n" + "\n".join(warned)
    (wheel,) = wheels.glob("trainops-*.whl")
    missing = _data_files_on_disk() - set(zipfile.ZipFile(wheel).namelist())
    assert not missing, f"data files the wheel leaves out (add them to [tool.setuptools.package-data]): {missing}"


def _share_torch(venv: Path, folder: Path) -> None:
    """The new environment sees the torch this one runs (a .pth to a folder of links to torch's files
    and nothing else), as the Makefile installs torch before the project: pip still resolves and
    installs everything else the wheel and torch declare, but torch's ~700 MB are not unpacked again."""
    torch = importlib.metadata.distribution("torch")
    site = Path(torch.locate_file(""))
    folder.mkdir()
    for top in {Path(str(f)).parts[0] for f in torch.files} - {".."}:
        (folder / top).symlink_to(site / top)
    (site_packages,) = (venv / "lib").glob("python3*/site-packages")
    (site_packages / "torch-of-the-test-runner.pth").write_text(f"{folder}\n")


@pytest.mark.slow
def test_the_wheel_installed_outside_the_repository_runs_the_cli_the_agent_and_a_training_run(tmp_path):
    wheels, source = tmp_path / "wheels", tmp_path / "source"
    shutil.copytree(REPO, source, ignore=NOT_SOURCE)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
          str(source)], source, dict(os.environ))
    (wheel,) = wheels.glob("trainops-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.startswith("trainops-")}
    assert top_level == {"trainops"}, f"the wheel installs more than one import name: {top_level}"
    for shipped in ("trainops/AGENTS.md", "trainops/skills/training-efficiency-ablation-and-fault-sop/SKILL.md",
                    "trainops/skills/evidence/evidence.schema.json", "trainops/skills/evidence/published.json",
                    "trainops/trainer/text/public_domain_excerpts.txt"):
        assert shipped in names, f"{shipped} is not in the wheel"

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, dict(os.environ))
    python, trainops = venv / "bin" / "python", venv / "bin" / "trainops"
    _share_torch(venv, tmp_path / "torch-only")
    # --no-compile: what runs compiles as it imports; byte-compiling every dependency up front cost minutes of CPU
    _run([str(python), "-m", "pip", "install", "-q", "--no-compile", "--disable-pip-version-check", str(wheel)],
         tmp_path, dict(os.environ))

    work = tmp_path / "elsewhere"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env.update(TRAINOPS_HOME=str(work / ".trainops"), OMP_NUM_THREADS="1", PATH=f"{venv / 'bin'}:{env['PATH']}")
    where = _run([str(python), "-c", "import trainops, importlib.util as u; print(trainops.__file__);"
                  "print(u.find_spec('tools'), u.find_spec('agents'), u.find_spec('trainer'))"], work, env).stdout
    assert str(venv) in where.splitlines()[0] and "None None None" in where
    rounds = _run([str(python), "-c", "from trainops.skills.evidence.references import published; "
                   "print(len(published()['mlperf_training']))"], work, env).stdout
    assert int(rounds) > 0, "the installed package cannot read its published MLPerf table"

    assert "Usage" in _run([str(trainops), "--help"], work, env).stdout
    assert "R-" in _run([str(trainops), "rules"], work, env).stdout
    skills = _run([str(trainops), "skill", "list", "--json"], work, env).stdout
    assert "training-efficiency-ablation-and-fault-sop" in skills
    answer = _run([str(trainops), "ask", "plan the checkpoint interval for a 60 s save, 300 s restart and 10 h MTBF",
                   "--json"], work, env).stdout
    assert "interval" in answer.lower()
    trained = json.loads(_run([str(trainops), "train", "--preset", "tiny", "--set", "training.steps=3", "--json"],
                              work, env).stdout)
    assert trained["status"] == "ok" and Path(trained["run_dir"]).is_relative_to(work)
