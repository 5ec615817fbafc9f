"""Every id-like field of every tool input the agent is offered (and the models nested in them) is
never empty and has a pattern, in the schema and in validation: an empty id is refused naming the
field, before the gate could queue the call for a human."""
from __future__ import annotations

import types
import typing

import pytest
from pydantic import BaseModel

from trainops.agents.agent_tools import agent_registry
from trainops.tools.base import ToolError
from trainops.tools.calls import call

ID_NAMES = {"node", "nodes", "exclude_nodes", "run", "runs", "baseline", "candidate", "tenant", "partition", "target"}
"""Fields that name a job, node, run, tenant or partition; any name ending in _id or _ids is one too."""
NOT_IDS = {("change_scheduler_policy", "target"): "empty means the global scope; otherwise held to a partition "
                                                   "name's pattern",
           ("change_scheduler_policy", "change.target"): "what the change touches, in words"}


def _id_like(name: str) -> bool:
    return name in ID_NAMES or name.endswith(("_id", "_ids"))


def _strings(annotation) -> list[tuple[typing.Any, list]]:
    """Each str the annotation holds (in an Optional, a list, an Annotated), with its metadata."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is str:
        return [(str, [])]
    if origin is typing.Annotated:
        return [(t, [*meta, *args[1:]]) for t, meta in _strings(args[0])]
    if origin in (typing.Union, types.UnionType, list, tuple, set, frozenset):
        return [s for arg in args for s in _strings(arg)]
    return []


def _constraints(metadata: list) -> tuple[int | None, str | None]:
    min_length = next((m.min_length for m in metadata if getattr(m, "min_length", None) is not None), None)
    pattern = next((m.pattern for m in metadata if getattr(m, "pattern", None) is not None), None)
    return min_length, pattern


def _models(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _id_fields(model: type[BaseModel], prefix: str = "", seen: set | None = None):
    seen = set() if seen is None else seen
    if model in seen:
        return
    seen.add(model)
    for name, field in model.model_fields.items():
        if _id_like(name):
            for _, metadata in _strings(field.annotation):
                yield f"{prefix}{name}", _constraints([*field.metadata, *metadata])
        for nested in _models(field.annotation):
            yield from _id_fields(nested, f"{prefix}{name}.", seen)


def test_every_id_like_field_of_every_tool_input_is_never_empty_and_has_a_pattern():
    missing = []
    for tool, spec in agent_registry().items():
        for path, (min_length, pattern) in _id_fields(spec.Input):
            if (tool, path) not in NOT_IDS and (not min_length or not pattern):
                missing.append(f"{tool}.{path} (min_length={min_length}, pattern={pattern})")
    assert not missing, "id-like fields without min_length=1 and a pattern: " + ", ".join(missing)


def test_the_walk_finds_the_fields_it_checks():
    found = {(tool, path) for tool, spec in agent_registry().items() for path, _ in _id_fields(spec.Input)}
    assert {("drain_node", "node"), ("resume_node", "node"), ("cancel_job", "job_id"), ("summarize_run", "run"),
            ("set_tenant_quota", "tenant"), ("rollback_change", "change_id"), ("submit_job", "spec.tenant"),
            ("submit_job", "exclude_nodes")} <= found


@pytest.mark.parametrize("tool, args, field", [
    ("drain_node", {"node": ""}, "node"), ("resume_node", {"node": ""}, "node"),
    ("drain_node", {"node": "n1 n2"}, "node"), ("job_status", {"job_id": ""}, "job_id"),
    ("cancel_job", {"job_id": ""}, "job_id"), ("summarize_run", {"run": ""}, "run"),
    ("rollback_change", {"change_id": "", "commands": []}, "change_id"),
    ("grep_log", {"job_id": "", "pattern": "x"}, "job_id"),
])
def test_an_empty_or_garbled_id_is_refused_naming_the_field(tool, args, field):
    with pytest.raises(ToolError, match=field):
        call(tool, args)


def test_a_bad_tenant_still_says_what_a_tenant_id_is():
    with pytest.raises(ToolError, match="tenant id '' is not valid: use 1 to 63 lowercase letters"):
        call("set_tenant_quota", {"tenant": "", "gpus": 1, "priority": "low", "reason": "test"})
