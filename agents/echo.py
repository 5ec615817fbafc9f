"""What a tool call read, apart from what it echoed: a tool often repeats its input in its result
(declare_environment's framework version, a run id in a finding, a grep pattern), and a model's own
sentence passed as an argument must not come back as evidence it can cite. Used by the agent's
report rules (answer.py, through the graph) and by the agent benchmark's scoring."""
from __future__ import annotations

from typing import Any

ECHO_WINDOW = 8
"""Characters in a row of a call's own arguments that mark a stretch of its result as echoed."""


def fold(text: str) -> str:
    """Whitespace runs as one space: how quotes and results are compared."""
    return " ".join(text.split())


def _scalars(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _scalars(v)]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _scalars(v)]
    return [] if value is None or isinstance(value, bool) else [value]


def _unecho_text(text: str, exact: set[str], windows: set[str]) -> str | None:
    folded = fold(text)
    if folded in exact:
        return None
    echoed = [False] * len(folded)
    for start in range(len(folded) - ECHO_WINDOW + 1):
        if folded[start:start + ECHO_WINDOW] in windows:
            echoed[start:start + ECHO_WINDOW] = [True] * ECHO_WINDOW
    return "".join("\x00" if mark else char for char, mark in zip(folded, echoed, strict=True))


def unechoed(result: Any, args: dict[str, Any], world: str | None = None) -> Any:
    """`result` (a tool's output as JSON data, or its error text) less what it echoes of its call's `args`:
    a value equal to an argument is dropped. Given the frozen `world` a replay runs in (folded text), any
    run of ECHO_WINDOW characters of an argument is blanked too, unless the world holds it: a run id or a
    grep pattern's words name what is there, a sentence of the model's own does not. The live agent has
    no such world to tell the two apart, so only whole echoed values go."""
    texts = [fold(str(v)) for v in _scalars(args)]
    exact = {t for t in texts if t}
    windows = {t[i:i + ECHO_WINDOW] for t in texts for i in range(len(t) - ECHO_WINDOW + 1)
               if world is not None and t[i:i + ECHO_WINDOW] not in world}

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()}
        if isinstance(value, list):
            return [strip(v) for v in value]
        if isinstance(value, str):
            return _unecho_text(value, exact, windows)
        return None if value is not None and not isinstance(value, bool) and fold(str(value)) in exact else value

    return strip(result)
