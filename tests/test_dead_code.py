"""No dead code in the product folders: vulture lists what nothing uses, and any finding fails here.

Used means used by the product, the tests, the report templates or a SKILL.md step's impl. A
model's fields (pydantic, TypedDict, NamedTuple) are its serialized contract, read by name only
through model_dump and the JSON schema, so they are never findings. What else is alive without a
caller vulture can see (framework entry points, library interfaces) is in
tests/dead_code_whitelist.py, each with its reason.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from vulture import Vulture

import trainops
from tests.dead_code_whitelist import ALIVE, ENTRY_DECORATORS
from trainops.skills.registry import all_skills

REPO = Path(trainops.__file__).resolve().parents[1]
PRODUCT = ("agents", "skills", "tools", "trainer", "trainops", "benchmarks")
MIN_CONFIDENCE = 60  # every unused function, class, method, property, attribute and variable
MODEL_BASES = {"BaseModel", "TypedDict", "NamedTuple"}
JINJA_EXPRESSION = re.compile(r"{{(.*?)}}|{%(.*?)%}", re.S)
ATTRIBUTE = re.compile(r"\.([A-Za-z_]\w*)")


def product_files() -> list[Path]:
    return [path for folder in PRODUCT for path in sorted((REPO / folder).rglob("*.py"))]


def model_fields() -> set[tuple[str, int]]:
    """(file, line) of every field declared in a model class, a subclass of a model included."""
    classes: dict[str, list[tuple[Path, ast.ClassDef]]] = {}
    for path in product_files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, []).append((path, node))

    def is_model(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name in MODEL_BASES:
            return True
        return name not in seen and any(is_model(ast.unparse(base).rpartition(".")[2], seen | {name})
                                        for _, node in classes.get(name, []) for base in node.bases)

    return {(str(path), stmt.lineno) for name, found in classes.items() for path, node in found if is_model(name)
            for stmt in node.body if isinstance(stmt, ast.AnnAssign)}


def names_read_outside_python() -> set[str]:
    """Attributes the Jinja report templates read and the functions SKILL.md steps name as their impl."""
    read = {name for template in REPO.glob("skills/**/*.j2")
            for expression in JINJA_EXPRESSION.findall(template.read_text(encoding="utf-8"))
            for name in ATTRIBUTE.findall("".join(expression))}
    impls = {step.impl.rpartition(".")[2] for skill in all_skills().values() for step in skill.steps if step.impl}
    return read | impls


def unused_product_code() -> list[str]:
    vulture = Vulture(ignore_names=list(ALIVE), ignore_decorators=list(ENTRY_DECORATORS))
    vulture.scavenge([str(REPO / folder) for folder in (*PRODUCT, "tests")])
    vulture.scan("\n".join(sorted(names_read_outside_python())), filename="templates-and-skills")
    fields = model_fields()
    return [item.get_report() for item in vulture.get_unused_code(min_confidence=MIN_CONFIDENCE)
            if Path(item.filename).resolve().relative_to(REPO).parts[0] in PRODUCT
            and (str(Path(item.filename).resolve()), item.first_lineno) not in fields]


def test_the_product_holds_no_code_that_nothing_uses():
    found = unused_product_code()
    assert not found, ("unused code: delete it, or, if something vulture cannot see calls it, add it to "
                       "tests/dead_code_whitelist.py with the reason:\n" + "\n".join(found))


def test_the_whitelist_names_only_what_is_still_there():
    source = "\n".join(path.read_text(encoding="utf-8") for path in product_files())
    stale = [name for name in ALIVE if not re.search(rf"\b{re.escape(name)}\b", source)]
    assert not stale, f"whitelisted names no product module defines any more: {stale}; drop them"
