"""The storage side of a checkpoint load: DCP's file system reader with every byte it reads from
storage counted and, for one reader per replica group (trainops.trainer.replica_load), each file
read once, whole, and checked against COMMIT.json's sha256 before DCP copies a byte of it.
Imported only when a checkpoint is loaded: torch.distributed.checkpoint costs every trainer start
0.6 s (trainops.trainer.checkpoint.AppState)."""
from __future__ import annotations

import hashlib
import io
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemReader

from trainops.trainer.checkpoint_files import COMMIT_FILE, corruption_message


def commit_listing(folder: Path) -> tuple[dict[str, dict[str, Any]], int, int]:
    """COMMIT.json's files, the world size that saved it and the bytes read for it."""
    raw = (folder / COMMIT_FILE).read_bytes()
    commit = json.loads(raw)
    return commit["files"], int(commit["world_size"]), len(raw)


def size_problems(folder: Path, listed: dict[str, dict[str, Any]]) -> str | None:
    """Missing or wrongly sized files, from the directory alone (no byte read): what a reader's
    sha256 check cannot reach when it needs only some of the files."""
    missing = [name for name in sorted(listed) if not (folder / name).is_file()]
    wrong = [name for name in sorted(listed) if name not in missing
             and (folder / name).stat().st_size != listed[name]["size_bytes"]]
    return corruption_message(folder, missing, wrong, bool(listed))




class CorruptCheckpoint(RuntimeError):
    """A file a reader needed is missing or differs from COMMIT.json (size or sha256)."""


class CountedFileSystem(FileSystem):
    """DCP's file system with every byte it reads counted; with `listed` (COMMIT.json's files), each
    file is read once, whole, and checked against its sha256 before DCP sees a byte of it."""

    def __init__(self, folder: Path, listed: dict[str, dict[str, Any]] | None = None) -> None:
        self.folder, self.listed = Path(folder), listed
        self.bytes_read = 0
        self._verified: dict[str, bytes] = {}

    def _read_whole(self, name: str) -> bytes:
        data = (self.folder / name).read_bytes()
        self.bytes_read += len(data)
        return data

    def verify(self, names: set[str]) -> str | None:
        """Read and check `names` (those not yet read); the verdict, None when all match."""
        if self.listed is None:
            return None
        mismatched = []
        for name in sorted(names - set(self._verified)):
            expected = self.listed.get(name)
            data = self._read_whole(name) if (self.folder / name).is_file() else None
            if expected is None or data is None or len(data) != expected["size_bytes"] \
                    or hashlib.sha256(data).hexdigest() != expected["sha256"]:
                mismatched.append(name)
            else:
                self._verified[name] = data
        return corruption_message(self.folder, [], mismatched)

    @contextmanager
    def create_stream(self, path, mode: str):
        name = Path(path).relative_to(self.folder).as_posix()
        if mode != "rb":
            raise ValueError(f"a checkpoint is only read here, not opened with mode {mode!r}")
        if self.listed is not None:
            if (problem := self.verify({name})) is not None:
                raise CorruptCheckpoint(problem)
            yield io.BytesIO(self._verified[name])
            return
        with Path(path).open("rb") as raw:
            yield _Counting(raw, self)

    def release(self) -> None:
        self._verified.clear()


class _Counting(io.RawIOBase):
    """A read-only file that adds what is read from it to its file system's count."""

    def __init__(self, raw, fs: CountedFileSystem) -> None:
        self.raw, self.fs = raw, fs

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.raw.seek(offset, whence)

    def tell(self) -> int:
        return self.raw.tell()

    def readinto(self, buffer) -> int:
        count = self.raw.readinto(buffer)
        self.fs.bytes_read += count or 0
        return count


class CountedReader(FileSystemReader):
    """FileSystemReader over a CountedFileSystem. Verifying, it checks every file of the plan before
    copying any (a corrupt file must leave the state untouched) and, with several readers, waits for
    all of them to agree on the verdict over `agree_group` before any copies."""

    def __init__(self, folder: Path, listed: dict[str, dict[str, Any]] | None = None,
                 agree_group=None, agree: bool = False) -> None:
        super().__init__(folder)
        self.fs = CountedFileSystem(Path(folder), listed)
        self.agree_group, self.agree = agree_group, agree

    def read_data(self, plan, planner):
        names = {self.storage_data[item.storage_index].relative_path for item in plan.items}
        problem = self.fs.verify(names)
        if self.agree:
            verdicts: list[str | None] = [None] * dist.get_world_size(self.agree_group)
            dist.all_gather_object(verdicts, problem, group=self.agree_group)
            problem = "; ".join(sorted({v for v in verdicts if v})) or None
        if problem is not None:
            raise CorruptCheckpoint(problem)
        try:
            return super().read_data(plan, planner)
        finally:
            self.fs.release()


def corrupt_reason(error: BaseException) -> str | None:
    """The CorruptCheckpoint message inside a DCP failure (CheckpointException gathers every rank's)."""
    if isinstance(error, CorruptCheckpoint):
        return str(error)
    failures = getattr(error, "failures", None) or {}
    reasons = sorted({str(exc) for exc, _ in failures.values() if isinstance(exc, CorruptCheckpoint)})
    return "; ".join(reasons) or None
