"""What an evidence pack must pass before a human may approve it (rule R-APR-1).

A pack's content is every entry under its folder: each file by its sha256, each folder (empty
ones too), and each symlink by its target, so nothing can hide in a name that is skipped or a
link that points elsewhere. Approval then checks what is there now: no symlinks, the content
trainops recorded in the audit log when it wrote the pack (a tripwire for a careless edit, not
proof: anything that can append to the log can append a `pack_written` entry), and the evidence
validators the caller passes in (trainops.skills.evidence.checks: the pack model, the claims
checks, one variable per ablation arm against the configs the runs actually used, and the pack
derived again from its sources, which is what an edited pack cannot pass).
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Callable

from trainops.tools.governance import audit

WRITTEN_KIND = "pack_written"
EVIDENCE_FILE = "evidence.json"
REPORT_FILE = "report.md"


def content_entries(folder: Path) -> dict[str, str]:
    """{relative path: what is there} for every entry under `folder`, never following a link:
    `sha256:HEX` for a file, `dir` for a folder, `symlink:TARGET` for a link, `special` otherwise."""
    out: dict[str, str] = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in sorted(dirs + files):
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                out[rel] = f"symlink:{os.readlink(path)}"
            elif stat.S_ISDIR(mode):
                out[rel + "/"] = "dir"
            elif stat.S_ISREG(mode):
                out[rel] = "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[rel] = "special"
    return dict(sorted(out.items()))


def content_hash(entries: dict[str, str]) -> str:
    return audit.sha256_hex(audit.canonical_json(entries))


def changed_entries(before: dict[str, str], now: dict[str, str]) -> list[str]:
    return sorted(k for k in before.keys() | now.keys() if before.get(k) != now.get(k))


def record_written(folder: Path, pack_id: str) -> dict:
    """Audit what trainops wrote as pack `pack_id` (called on the finished folder before it is
    published): a record of what was written, which approval compares with the pack as a tripwire;
    proof that the pack is trainops' own is its re-derivation (skills/evidence/pack.derivation_problems)."""
    entries = content_entries(folder)
    return audit.append(WRITTEN_KIND, pack=pack_id, content_hash=content_hash(entries), files=entries)


def _written_record(pack_id: str) -> dict | None:
    written = [e for e in audit.read() if e.get("kind") == WRITTEN_KIND and e.get("pack") == pack_id]
    return written[-1] if written else None


def approval_problems(folder: Path, pack_id: str, entries: dict[str, str],
                      evidence_problems: Callable[[Path], list[str]]) -> list[str]:
    """Every rule the pack breaks now; empty when it may be approved. `evidence_problems` is the
    evidence layer's validator (trainops.skills.evidence.checks), passed in so that governance
    never imports the skills above it."""
    problems = [f"R-APR-1: {path} is a {kind.split(':')[0]} entry: a pack holds plain files and folders only; "
                "remove it or build a new pack"
                for path, kind in entries.items() if not kind.startswith(("sha256:", "dir"))]
    written = _written_record(pack_id)
    if written is None:
        problems.append(f"R-APR-1: the audit log has no record of trainops writing pack {pack_id!r}: it was made or "
                        "copied in by hand; build it with `trainops evidence build` or `trainops sop`")
    elif written.get("content_hash") != content_hash(entries):
        changed = changed_entries(written.get("files", {}), entries)
        problems.append(f"R-APR-1: pack {pack_id!r} was edited after trainops wrote it (audit entry {written['seq']}): "
                        f"{', '.join(changed)} changed; build a new pack instead of editing one")
    if EVIDENCE_FILE not in entries:
        return problems + [f"R-APR-1: pack {pack_id!r} has no {EVIDENCE_FILE}: there is no evidence to approve; "
                           "build the pack with `trainops evidence build` or `trainops sop`"]
    return problems + evidence_problems(folder)
