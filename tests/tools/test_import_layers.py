"""Imports flow one way and never loop, at import time or at call time through an import inside a
function (issues 15 and 22): the registry is built by a function, so no tool module needs another
to be imported first, and the tools layer never reaches up into the agent. Read from the source
with `ast`, so the check costs no imports."""
from __future__ import annotations

import ast
from pathlib import Path

import trainops

REPO = Path(trainops.__file__).resolve().parents[1]
LAYERS = {"trainops.tools": "tools", "trainops.agents": "agents", "trainops.skills": "skills",
          "trainops.trainer": "trainer", "trainops": "trainops"}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in LAYERS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(REPO / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def imported(path: Path, known: set[str], *, module_level_only: bool) -> set[str]:
    """The trainops modules `path` imports (at module level only, or anywhere), less TYPE_CHECKING ones."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                names.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module:
                names.add(child.module)
                names.update(f"{child.module}.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return names & known


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strong(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                strong(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            if component:
                found.append(sorted([node, *component]))

    for node in graph:
        if node not in index:
            strong(node)
    return found


def test_no_module_imports_one_that_imports_it_back_at_import_time():
    known = modules()
    graph = {name: imported(path, set(known), module_level_only=True) for name, path in known.items()}
    assert cycles(graph) == []


def test_no_cycle_even_through_imports_inside_functions():
    """An import inside a function still binds the two modules: a loop through one only waits for
    the call that closes it. Tools, skills, agents, trainer and CLI alike form no loop at call time."""
    known = modules()
    graph = {name: imported(path, set(known), module_level_only=False) for name, path in known.items()}
    assert cycles(graph) == []


def test_the_tools_layer_never_imports_the_agent_or_the_command_line():
    known = modules()
    upward = {f"{name} -> {target}" for name, path in known.items() if name.startswith("trainops.tools")
              for target in imported(path, set(known), module_level_only=False)
              if target.startswith(("trainops.agents", "trainops.commands", "trainops.cli"))}
    assert upward == set()


def test_the_agents_registry_and_its_tools_do_not_import_each_other():
    known = modules()
    graph = {name: imported(path, set(known), module_level_only=False) for name, path in known.items()
             if name.startswith("trainops.agents")}
    assert cycles({name: targets & graph.keys() for name, targets in graph.items()}) == []


def test_the_cycle_finder_finds_a_loop():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


ORDER = [("trainops.workspace", 0), ("trainops.settings", 0), ("trainops.run_folder", 0),
         ("trainops.run_records", 0), ("trainops.record_keys", 0), ("trainops.terminal_text", 0),
         ("trainops.redact", 0), ("trainops.trainer", 1),
         ("trainops.tools", 2), ("trainops.skills", 3), ("trainops.agents", 4), ("trainops", 5)]


def layer(module: str) -> int:
    """Bottom (0): the workspace, settings, run folder, its records and terminal text; then the trainer, tools, skills,
    agents; the CLI on top."""
    return next(rank for prefix, rank in ORDER if module == prefix or module.startswith(prefix + "."))


def test_every_import_points_down_the_layers_even_inside_functions():
    known = modules()
    upward = sorted(f"{name} -> {target}" for name, path in known.items()
                    for target in imported(path, set(known), module_level_only=False)
                    if layer(target) > layer(name))
    assert upward == []


def test_the_bottom_modules_import_nothing_of_trainops_above_them():
    known = modules()
    bottom = {"trainops.workspace", "trainops.settings", "trainops.run_folder", "trainops.run_records",
              "trainops.record_keys", "trainops.terminal_text", "trainops.redact"}
    for module in bottom:
        assert imported(known[module], set(known), module_level_only=False) <= bottom
