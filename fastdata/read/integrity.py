"""Integrity checks on read: damage inside a shard is named, not silently trained on.

Three modes (``fastdata.loader(..., integrity=...)``, ``open_cache(path, integrity=...)``):

  shard   (default) each shard's sha256 is computed once per process, on first use, by one
          background thread, and compared with the manifest; a mismatch is raised by the next
          batch read from the cache, naming the shard and (by their crc32) the damaged samples.
          Cost: one extra sequential read of each shard per process, on one core, off the
          training thread; reads are never delayed.
  sample  every sample's crc32 is checked right after it is gathered, in the reader thread,
          before the batch is handed out: damage never reaches the model, but every byte is
          read twice on the reader threads.
  off     no check (`fastdata verify` remains the full audit).

The cost of each mode against off is measured by benchmarks/integrity.py (results/integrity-*;
the README's table): shard is within noise, sample costs a reader-bound loader a large share.
Why shard is the default: it catches every flipped byte in pixels, labels or metadata within
seconds of the first epoch starting, at a cost the training thread does not see.
"""
from __future__ import annotations

import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .._util import file_sha256
from ..errors import CacheFormatError, LoaderError

MODES = ("shard", "sample", "off")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise LoaderError(f"integrity={mode!r}: choose one of {', '.join(MODES)}")
    return mode


def _shard_damage(path: Path, sha256: str, open_shard, first: int = 0) -> str | None:
    """None when the file's sha256 matches; else a message naming the shard and damaged samples, by
    their index in the cache (the shard's holds `first` on), as `fastdata verify` names them."""
    if file_sha256(path) == sha256:
        return None
    try:
        shard = open_shard()
        bad = [(j, shard.keys[j]) for j in shard.failing_crc()]
    except CacheFormatError as e:
        return str(e)
    what = "damaged " + ", ".join(f"sample {first + j} ({k})" for j, k in bad[:5]) + (" ..." if len(bad) > 5 else "") \
        if bad else "every sample's crc32 matches, so its metadata is damaged or it is another file (a copy of " \
                    "another shard?)"
    return (f"{path}: sha256 differs from manifest.json: {what}; run `fastdata verify "
            f"{path.parent}` and rebuild the cache (rerunning build-cache rebuilds only damaged shards)")


class ShardHasher:
    """One background thread hashing shards in the order they are first used."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: dict[int, Future] = {}
        self._lock = threading.Lock()
        self.problem: str | None = None   # the first mismatch found, set by the hashing thread

    def submit(self, index: int, path: Path, sha256: str, open_shard, first: int = 0) -> None:
        with self._lock:
            if index in self._jobs:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="fastdata-integrity")
            self._jobs[index] = self._pool.submit(self._run, path, sha256, open_shard, first)

    def _run(self, path: Path, sha256: str, open_shard, first: int) -> None:
        problem = _shard_damage(path, sha256, open_shard, first)
        if problem is not None and self.problem is None:
            self.problem = problem

    def raise_if_damaged(self) -> None:
        """Raise the first mismatch found so far: one attribute read per call, never a wait."""
        if self.problem is not None:
            raise CacheFormatError(self.problem)

    def join(self) -> None:
        """Block until every shard submitted so far is hashed (tests, benchmarks)."""
        for f in list(self._jobs.values()):
            f.result()


def check_rows(rows: np.ndarray, expected: np.ndarray, name_of) -> None:
    """crc32 of each gathered row (n, bytes) against the stored crc32; name_of(k) names row k."""
    for k in range(len(rows)):
        if zlib.crc32(rows[k]) != int(expected[k]):
            raise CacheFormatError(f"{name_of(k)}: crc32 mismatch, the sample is damaged on disk; run "
                                   f"`fastdata verify` and rebuild the cache")
