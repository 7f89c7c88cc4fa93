"""Build lock and resume journal.

The journal (DEST/.build/journal.json) is rewritten atomically after every
finished shard. It records the build fingerprint, the shards done so far,
the index of the next input item and the inputs quarantined before it. On
resume, shards are re-checked against their recorded checksum; anything not
in the journal (a *.tmp, a shard renamed just before a kill) is deleted and
redone, so a resumed cache equals an uninterrupted one byte for byte.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .._util import file_sha256, write_json_atomic
from ..errors import BuildError
from .format import ShardInfo

BUILD_DIR = ".build"


class BuildLock:
    """An flock on DEST/.build/lock. The kernel drops it when the holder dies, even by kill -9."""

    def __init__(self, dest: Path) -> None:
        self.path = dest / BUILD_DIR / "lock"
        self._fd: int | None = None

    def __enter__(self) -> "BuildLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.path.read_text().strip() or "another process"
            raise BuildError(f"{self.path.parent.parent}: another build is writing here ({holder}); "
                             f"wait for it to finish or choose another DEST") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def fingerprint(config: dict, keys: list[str]) -> str:
    """What must not change between a killed build and its resume: settings and input list."""
    h = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    for k in keys:
        h.update(k.encode() + b"\0")
    return h.hexdigest()


@dataclass
class Journal:
    fingerprint: str
    next_item: int = 0
    shards: list[ShardInfo] = field(default_factory=list)
    quarantined: list[dict] = field(default_factory=list)

    @property
    def path_in(self) -> str:
        return f"{BUILD_DIR}/journal.json"

    def save(self, dest: Path) -> None:
        write_json_atomic(dest / self.path_in, {
            "fingerprint": self.fingerprint, "next_item": self.next_item,
            "shards": [s.__dict__ for s in self.shards], "quarantined": self.quarantined})


def load_journal(dest: Path, fp: str) -> Journal:
    """The valid resume state in DEST, or a fresh journal. Damaged tail shards are dropped."""
    path = dest / BUILD_DIR / "journal.json"
    if not path.exists():
        return Journal(fp)
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return Journal(fp)  # written atomically, so unreadable means foreign: start over
    if d.get("fingerprint") != fp:
        raise BuildError(f"{dest}: holds an unfinished build with other settings or inputs; "
                         f"rerun it with the same options, or delete {dest} to start over")
    journal = Journal(fp, int(d["next_item"]), [ShardInfo(**s) for s in d["shards"]], list(d["quarantined"]))
    for i, s in enumerate(journal.shards):
        p = dest / s.name
        if not p.exists() or p.stat().st_size != s.bytes or file_sha256(p) != s.sha256:
            raise BuildError(f"{p}: recorded as finished but missing or changed since; "
                             f"delete {dest} and build again")
    return journal


def clean_strays(dest: Path, keep: set[str]) -> None:
    """Remove half-written *.tmp files and shards the journal does not vouch for."""
    for p in dest.iterdir():
        if p.is_file() and p.name.startswith("shard-") and p.name not in keep:
            p.unlink()
