"""Framework and library changes between approved baselines (K-IN-3).

An upgrade of torch, the framework, the scheduler or trainops itself is a change like a scheduler
policy: a figure measured before it is not evidence after it. The history is derived, never kept
in a file a job could edit: it is read from the evidence packs a human approved, whose content the
decision's signature covers (a pack edited since its approval is skipped).
"""
from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field

from trainops.tools.governance import approvals
from trainops.tools.governance.pack_checks import EVIDENCE_FILE
from trainops.workspace import packs_dir

Component = Literal["torch", "framework", "scheduler", "trainops"]


class VersionChange(BaseModel):
    component: Component
    before: str = Field(description="as the earlier approved pack declared it")
    after: str = Field(description="as the later declaration (or pack) says")


class BaselineChange(BaseModel):
    """What changed from one approved pack to the next."""
    pack: str = Field(description="the later approved pack")
    since_pack: str = Field(description="the approved pack before it")
    approved_at: float
    changes: list[VersionChange]


class SinceApproved(BaseModel):
    """The declared versions against the newest approved pack's."""
    pack: str | None = Field(description="the newest approved pack; None when no pack was approved yet")
    changes: list[VersionChange] = Field(default_factory=list)


def pack_versions(evidence: dict) -> dict[str, str]:
    """component -> declared version, from an evidence pack's environment and versions."""
    env, versions = evidence.get("environment") or {}, evidence.get("versions") or {}
    found = {"torch": env.get("torch_version"), "scheduler": env.get("scheduler"), "trainops": versions.get("trainops")}
    if env.get("framework"):
        found["framework"] = f"{env['framework']} {env.get('framework_version', '')}".strip()
    return {k: str(v) for k, v in found.items() if v}


def approved_packs() -> list[tuple[float, str, dict[str, str]]]:
    """(approved at, pack id, its versions) of each pack whose newest decision is an approval that
    verifies (signature, chain, content unchanged), oldest first."""
    approved = []
    for folder in sorted(p for p in packs_dir().iterdir() if p.is_dir() and not p.name.startswith(".")):
        check = approvals.verify_pack(folder.name)
        if not check.ok or check.decision != "approved":
            continue
        try:
            evidence = json.loads((folder / EVIDENCE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        approved.append((check.decided_at, folder.name, pack_versions(evidence)))
    return sorted(approved)


def differences(before: dict[str, str], after: dict[str, str]) -> list[VersionChange]:
    return [VersionChange(component=c, before=before[c], after=after[c])
            for c in ("framework", "torch", "scheduler", "trainops") if c in before and c in after
            and before[c] != after[c]]


def baseline_history() -> list[BaselineChange]:
    """Each approved pack whose versions differ from the approved pack before it."""
    approved = approved_packs()
    history = []
    for (_, earlier, old), (at, later, new) in zip(approved, approved[1:], strict=False):
        if changes := differences(old, new):
            history.append(BaselineChange(pack=later, since_pack=earlier, approved_at=at, changes=changes))
    return history


def since_approved(versions: dict[str, str]) -> SinceApproved:
    """The declared `versions` against the newest approved pack's (S1, and the pack's own list)."""
    approved = approved_packs()
    if not approved:
        return SinceApproved(pack=None)
    _, pack, old = approved[-1]
    return SinceApproved(pack=pack, changes=differences(old, versions))
