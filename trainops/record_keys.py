"""Keys that seal what trainops' own processes write into a run folder, so that a reader can tell it
from what the job wrote there. A run folder is the job's to write: a line appended to
`recoveries.jsonl` by a job that never ran under the in-process supervisor looked like the
supervisor's own (three hardware interruptions, an MTBF of one second, an escalation).

The workspace's key is made once, outside the workspace (`$TRAINOPS_KEYS_DIR`, else
`$XDG_STATE_HOME/trainops/keys`, a 0700 folder; the file 0600, named by the workspace's path). A
run's key is derived from it and the run folder's resolved path. trainops hands a run's key to the
supervisor it launches, in that process's environment only; the supervisor takes it out of its own
environment before it starts the ranks, and seals each record with it (HMAC-SHA256); a reader keeps
only the records whose seal verifies. A job launched without the supervisor never held a key, and a
key opens one run folder only. What this does not stop (docs/governance.md, threat model): code
running as the same OS user can read the key file or a supervisor's /proc/PID/environ.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from trainops.workspace import home

ENV_KEYS_DIR = "TRAINOPS_KEYS_DIR"
RECORD_KEY_ENV = "TRAINOPS_RECORD_KEY"
"""The supervisor's environment variable carrying its run's key (hex); never passed to a rank."""
KEY_BYTES = 32


def keys_dir() -> Path:
    explicit = os.environ.get(ENV_KEYS_DIR)
    if explicit:
        return Path(explicit).expanduser()
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "trainops" / "keys"


def _workspace_key_path() -> Path:
    return keys_dir() / f"{hashlib.sha256(str(home().resolve()).encode()).hexdigest()[:32]}.key"


def _workspace_key(create: bool) -> bytes | None:
    """This workspace's key; made at the first launch that needs one (`create`), never by a reader."""
    path = _workspace_key_path()
    if create and not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except FileExistsError:
            pass  # another launch made it first: read theirs
        else:
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(KEY_BYTES))
    try:
        key = path.read_bytes()
    except OSError:
        return None
    return key if len(key) == KEY_BYTES else None


def run_key(run_dir: str | Path, *, create: bool = False) -> bytes | None:
    """The key of one run folder (None: this workspace has no key yet, so nothing was sealed)."""
    key = _workspace_key(create)
    if key is None:
        return None
    return hmac.new(key, b"run\0" + str(Path(run_dir).resolve()).encode(), hashlib.sha256).digest()


def seal(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def sealed_with(key: bytes | None, body: str, mac: str) -> bool:
    """Whether `mac` is `body`'s seal under `key` (never with no key)."""
    return key is not None and hmac.compare_digest(seal(key, body), mac)
