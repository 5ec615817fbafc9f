"""Tools by name: the part of the registry every layer may import without loading a single tool.

The list of trainops' tools, and building a registry from it, is `trainops.tools.catalog`.
Which registry is served to a command or a call is `trainops.tools.context.serving`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Iterable, Iterator

from trainops.tools.base import ToolError, ToolSpec


def spec_of(fn: Callable) -> ToolSpec:
    spec = getattr(fn, "tool_spec", None)
    if not isinstance(spec, ToolSpec):
        raise TypeError(f"{getattr(fn, '__qualname__', fn)!r} is not a tool: declare it with @tool(name, risk=...)")
    return spec


class Registry(Mapping[str, ToolSpec]):
    """Tools by name, sorted."""
    def __init__(self, specs: Iterable[ToolSpec]):
        by_name: dict[str, ToolSpec] = {}
        for spec in specs:
            if spec.name in by_name and by_name[spec.name] is not spec:
                raise ValueError(f"tool {spec.name} is declared twice: give one of them another name")
            by_name[spec.name] = spec
        self._specs = dict(sorted(by_name.items()))

    def __getitem__(self, name: str) -> ToolSpec:
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def spec(self, name: str) -> ToolSpec:
        """The tool called `name`; an unknown name is a ToolError listing the known ones."""
        if name not in self._specs:
            raise ToolError(name, f"unknown tool; known tools: {', '.join(self._specs)}")
        return self._specs[name]
