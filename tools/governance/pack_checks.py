"""What an evidence pack must pass before a human may approve it (rule R-APR-1).

A pack's content is every entry under its folder: each file by its sha256, each folder (empty
ones too), and each symlink by its target, so nothing can hide in a name that is skipped or a
link that points elsewhere. Approval then re-runs the evidence validators on what is there now:
the pack model, the claims governance checks (R-ENV-1/2, R-EVD-2, report text), one variable per
ablation arm against the configs the runs actually used (R-ABL-1), no symlinks, and the content
trainops recorded in the audit log when it wrote the pack, so a pack edited afterwards, or one
trainops never wrote, is refused with the rule it breaks.
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

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
    published), so approval can tell the pack it wrote from one edited or made by hand later."""
    entries = content_entries(folder)
    return audit.append(WRITTEN_KIND, pack=pack_id, content_hash=content_hash(entries), files=entries)


def _written_record(pack_id: str) -> dict | None:
    written = [e for e in audit.read() if e.get("kind") == WRITTEN_KIND and e.get("pack") == pack_id]
    return written[-1] if written else None


def approval_problems(folder: Path, pack_id: str, entries: dict[str, str]) -> list[str]:
    """Every rule the pack breaks now; empty when it may be approved."""
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
    return problems + _evidence_problems(folder)


def _evidence_problems(folder: Path) -> list[str]:
    """The evidence validators (trainops.skills.evidence model + governance claims) on the files now."""
    from pydantic import ValidationError

    from trainops.skills.evidence.model import EvidencePack
    from trainops.skills.evidence.pack import governance_errors

    try:
        pack = EvidencePack.model_validate_json((folder / EVIDENCE_FILE).read_bytes())
    except (ValidationError, ValueError) as exc:
        return [f"R-APR-1: {EVIDENCE_FILE} is not a valid evidence pack ({str(exc).splitlines()[0]}); build a new pack"]
    report = folder / REPORT_FILE
    markdown = report.read_text(encoding="utf-8", errors="replace") if report.is_file() else ""
    return governance_errors(pack, markdown) + _ablation_problems(pack)


def _ablation_problems(pack) -> list[str]:
    """R-ABL-1 on the configs the runs used: each arm against the baseline, exactly one setting apart."""
    from pydantic import ValidationError

    from trainops.tools.governance.claims import AblationArm

    problems = []
    baseline_run = pack.baseline.run_dirs[0] if pack.baseline and pack.baseline.run_dirs else None
    for row in pack.ablations:
        name = f"{row.knob}={row.value}"
        configs = [_run_config(run) for run in (baseline_run, row.source_run)]
        if None in configs:
            problems.append(f"R-ABL-1: ablation arm {name} cannot be checked: the config.toml of its baseline run "
                            f"({baseline_run}) or arm run ({row.source_run}) is missing; keep the run folders "
                            "with the pack")
            continue
        try:
            AblationArm(name=name, baseline_config=configs[0], arm_config=configs[1])
        except ValidationError as exc:
            problems += [f"ablation arm {name}: {e['msg']}" for e in exc.errors()]
    return problems


def _run_config(run: str | None) -> dict | None:
    import tomllib

    from trainops.tools.governance.claims import resolve_run

    folder = resolve_run(run) if run else None
    config = folder / "config.toml" if folder else None
    if config is None or not config.is_file():
        return None
    try:
        return tomllib.loads(config.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
