"""The action gate. Every tool call passes `before_call` and `after_call`.

This first version records each call and its timing in the audit log; the governance issue
adds rule checks, approval tokens and the hash chain.
"""
from __future__ import annotations

import json
import time

from pydantic import BaseModel


def before_call(spec, inp: BaseModel, ctx) -> None:
    return None


def after_call(spec, inp: BaseModel, ctx, *, started: float, output: BaseModel | None, error: Exception | None) -> None:
    from trainops.workspace import audit_log_path

    entry = {
        "time": time.time(),
        "kind": "tool_call",
        "tool": spec.name,
        "risk": spec.risk,
        "actor": ctx.actor,
        "elapsed_s": round(time.time() - started, 6),
        "ok": error is None,
        "error": None if error is None else str(error),
    }
    with open(audit_log_path(), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")
