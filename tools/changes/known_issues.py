"""Known issues: a person's note against a version of torch, a framework, the scheduler or trainops
(K-IN-3), shown beside any environment declaration with that version (S1), in the evidence pack and
to the agent. A note is recorded with `trainops known-issue`, its hash in the audit log: a line
appended to the store by anything else (a job, another workspace writer) is not shown. Notes are
quoted as data, never acted on.
"""
from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError, field_validator

from trainops.terminal_text import is_visible
from trainops.tools.governance import audit
from trainops.tools.versions import current
from trainops.workspace import home

KNOWN_ISSUE_EVENT = "known_issue"
VERSION_PATTERN = r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$"


class KnownIssue(BaseModel):
    component: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,39}$",
                           description="torch, scheduler, trainops, or a framework's name (deepspeed, megatron...)")
    versions: str = Field(pattern=VERSION_PATTERN, description="a version or its prefix: '2.13' covers 2.13.0, 2.13.1")
    text: str = Field(min_length=1, max_length=500, description="what goes wrong, and the workaround if known")
    added_by: str = ""
    added_at: float = 0.0

    @field_validator("text")
    @classmethod
    def _printable(cls, value: str) -> str:
        if "\n" in value or not is_visible(value):
            raise ValueError("text: one line of printable characters (no newlines, control or bidi characters); "
                             "write the note on one line")
        return value

    def covers(self, versions: dict[str, str]) -> bool:
        """Whether this note is about a version declared in `versions` (component -> 'name version')."""
        for component, declared in versions.items():
            name, _, version = declared.rpartition(" ") if " " in declared else (component, "", declared)
            if self.component in (component, name.lower()) and _within(version, self.versions):
                return True
        return False


def _within(version: str, prefix: str) -> bool:
    return version == prefix or version.startswith(prefix + ".") or version.startswith(prefix + "+")


def _store() -> Path:
    return home() / "known-issues.jsonl"


def add_known_issue(issue: KnownIssue, principal: str) -> KnownIssue:
    """Record a person's note; its hash goes to the audit log, which is what makes it readable later."""
    issue = issue.model_copy(update={"added_by": principal, "added_at": time.time()})
    line = audit.canonical_json(issue.model_dump(mode="json"))
    audit.append(KNOWN_ISSUE_EVENT, sha256=audit.sha256_hex(line), component=issue.component, versions=issue.versions)
    with _store().open("a", encoding="utf-8") as out:
        out.write(line + "\n")
    return issue


def known_issues(versions: dict[str, str] | None = None) -> list[KnownIssue]:
    """The recorded notes whose hash the audit log holds (all, or those covering `versions`)."""
    store = _store()
    if not store.is_file():
        return []
    recorded = {e.get("sha256") for e in audit.read() if e.get("kind") == KNOWN_ISSUE_EVENT}
    found = []
    with store.open(encoding="utf-8", errors="replace") as lines:
        for line in lines:
            if audit.sha256_hex(line.rstrip("\n")) not in recorded:
                continue
            try:
                issue = KnownIssue.model_validate_json(line)
            except ValidationError:
                continue
            if versions is None or issue.covers(versions):
                found.append(issue)
    return found


def declared_versions(framework: str, framework_version: str, torch: str, scheduler: str) -> dict[str, str]:
    """component -> version as an environment declaration gives them, in the evidence pack's form."""
    return {"framework": f"{framework} {framework_version}", "torch": torch, "scheduler": scheduler,
            "trainops": current().trainops}
