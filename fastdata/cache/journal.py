"""Build lock and resume journal.

The journal (DEST/.build/journal.json) is rewritten atomically each time a
shard finishes. It records the build fingerprint, each finished shard's
ShardInfo (None when every input of the shard was quarantined) and the
inputs quarantined per shard. On resume every recorded shard is re-checked
against its checksum; shard files the journal does not vouch for (a *.tmp,
or a shard renamed just before a kill) are deleted and rebuilt.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .._util import file_sha256, write_json_atomic
from ..errors import BuildError
from .format import ShardInfo

log = logging.getLogger("fastdata.build")
BUILD_DIR = ".build"
JOURNAL = f"{BUILD_DIR}/journal.json"


class BuildLock:
    """An flock on DEST/.build/lock. The kernel drops it when the holder dies, even by kill -9."""

    def __init__(self, dest: Path) -> None:
        self.path = dest / BUILD_DIR / "lock"
        self._fd: int | None = None
        self.locked = True      # False where the filesystem has no flock (the build goes on, with a warning)

    def __enter__(self) -> "BuildLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:   # a read-only mount or another user's cache: nothing was written
            raise BuildError(f"DEST {self.path.parent.parent} is not writable ({e.strerror or e}); a build writes "
                             f"there even to confirm a finished cache: choose a folder you can write to, or "
                             f"check this cache with `fastdata verify {self.path.parent.parent}`") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self.path.read_text().strip() or "another process"
            raise BuildError(f"{self.path.parent.parent}: another build is writing here ({holder}); "
                             f"wait for it to finish or choose another DEST") from None
        except OSError as e:   # no flock on this filesystem: Lustre mounted noflock (ENOSYS), NFS without
            #                    lockd (ENOLCK), some FUSE mounts (EOPNOTSUPP). The build itself needs no lock
            self.locked = False
            log.warning("%s: this filesystem does not support file locks (%s), so a second build started "
                        "into the same DEST would not be refused: run one build at a time here",
                        self.path.parent.parent, e.strerror or e)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            if self.locked:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def key_bytes(key: str) -> bytes:
    """A key's bytes, lossless for file names that are not valid UTF-8 (Python hands them over with
    surrogate escapes, which plain .encode() refuses)."""
    return key.encode("utf-8", "surrogateescape")


def _hash_keys(h, keys) -> None:
    for k in keys:
        h.update(key_bytes(k) + b"\0")


def inputs_digest(keys) -> str:
    h = hashlib.sha256()
    _hash_keys(h, keys)
    return h.hexdigest()


def labels_digest(label_map: dict[str, int], labels) -> str:
    """sha256 of the label map and each input's class name, in input order: a file list's labels can change
    while its paths stay (a mislabelled image fixed in the CSV), and a rerun must then not call the old
    cache built; nor after --classes-from gave the names other ids."""
    names = {v: k for k, v in label_map.items()}
    h = hashlib.sha256(json.dumps(sorted(label_map.items())).encode())   # the ids given to the names
    for label in labels:
        h.update(names.get(label, str(label)).encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()


def fingerprint(config: dict, keys: list[str]) -> str:
    """What must not change between a killed build and its resume: settings and input list."""
    h = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    _hash_keys(h, keys)
    return h.hexdigest()


@dataclass
class Journal:
    fingerprint: str
    shards: dict[int, ShardInfo | None] = field(default_factory=dict)
    quarantined: dict[int, list[dict]] = field(default_factory=dict)

    def record(self, index: int, info: ShardInfo | None, quarantined: list[dict]) -> None:
        self.shards[index] = info
        if quarantined:
            self.quarantined[index] = quarantined

    def save(self, dest: Path) -> None:
        write_json_atomic(dest / JOURNAL, {
            "fingerprint": self.fingerprint,
            "shards": {str(k): (v.__dict__ if v else None) for k, v in self.shards.items()},
            "quarantined": {str(k): v for k, v in self.quarantined.items()}})

    def remove(self, dest: Path) -> None:
        (dest / JOURNAL).unlink(missing_ok=True)


def load_journal(dest: Path, fp: str, problem=None) -> Journal:
    """The valid resume state in DEST, or a fresh journal. problem(info) -> why a recorded shard is not
    there intact (default: the local file's size and sha256; object storage checks the object)."""
    path = dest / JOURNAL
    if not path.exists():
        return Journal(fp)
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return Journal(fp)  # written atomically, so unreadable means foreign: start over
    if d.get("fingerprint") != fp:
        raise BuildError(f"{dest}: holds an unfinished build with other settings or inputs; "
                         f"rerun it with the same options, or delete {dest} to start over")
    shards = {int(k): (ShardInfo(**v) if v else None) for k, v in d["shards"].items()}
    problem = problem or (lambda info: shard_problem(dest, info))
    for s in shards.values():
        if s is not None and problem(s) is not None:
            raise BuildError(f"{dest / s.name}: recorded as finished but missing or changed since; "
                             f"delete {dest} and build again")
    return Journal(fp, shards, {int(k): v for k, v in d["quarantined"].items()})


OWN_FILE = re.compile(r"^shard-\d{5,}\.(h5|pt)(\.tmp)?$|^manifest\.json\.tmp$")


def clean_strays(dest: Path, keep: set[str]) -> None:
    """Remove half-written *.tmp files and shards the journal does not vouch for. Only names this
    program writes are touched (DEST was checked to be a fastdata cache before the lock was taken),
    so a user's own `shard-plan.txt` is never deleted."""
    for p in dest.iterdir():
        if OWN_FILE.match(p.name) and p.name not in keep and p.is_file() and not p.is_symlink():
            p.unlink()


def shard_problem(dest: Path, info: ShardInfo) -> str | None:
    """Why a finished cache's shard cannot be kept (missing, resized, checksum), or None."""
    p = dest / info.name
    if not p.is_file():
        return "missing"
    if p.stat().st_size != info.bytes:
        return f"size {p.stat().st_size} B, manifest says {info.bytes} B"
    if file_sha256(p) != info.sha256:
        return "sha256 mismatch"
    return None


def journal_from_manifest(dest: Path, manifest, fp: str, shard_of: dict[str, int], problem=None
                          ) -> tuple[Journal, dict]:
    """Resume state for repairing a finished cache: every intact shard is kept; missing or damaged
    ones are left out of the journal, so the build redoes exactly those. shard_of maps an input key
    to its shard index (quarantined inputs are put back under their shard). Returns (journal,
    {shard name: problem}). Shard indices absent from the manifest held only quarantined inputs."""
    problem = problem or (lambda info: shard_problem(dest, info))
    problems = {s.name: why for s in manifest.shards if (why := problem(s)) is not None}
    index = {s.name: int(s.name.split("-")[1].split(".")[0]) for s in manifest.shards}
    bad = {index[n] for n in problems}
    journal = Journal(fp)
    for k in set(shard_of.values()):
        if k not in bad:
            journal.shards[k] = None
    for s in manifest.shards:
        if s.name not in problems:
            journal.shards[index[s.name]] = s
    for q in manifest.quarantined:
        k = shard_of.get(q["path"])
        if k is not None and k not in bad:
            journal.quarantined.setdefault(k, []).append(q)
    return journal, problems
