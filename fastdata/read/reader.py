"""open_cache(path): memory-mapped, per-process access to a finished cache.

Both shard containers expose ``data`` as a flat uint8 tensor backed by the
page cache: .pt through ``torch.load(mmap=True)``, .h5 by memory-mapping the
contiguous dataset at its file offset (h5py is used only to read the small
arrays and that offset, then closed). No h5py handle outlives open, so the
Cache is safe to fork or pickle into DataLoader workers; mapped shards are
dropped on pickling and re-mapped lazily in the worker.
"""
from __future__ import annotations

import bisect
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import torch

from .._util import refuse_url, user_path
from ..stores.local import LocalStore
from ..stores.s3 import is_url
from ..cache.format import Manifest, load_manifest
from ..cache.shardfile import Shard, open_shard
from ..errors import CacheFormatError
from .integrity import ShardHasher, check_mode

log = logging.getLogger("fastdata.reader")



class Cache:
    """A finished cache: manifest plus lazily mapped shards. Index with a global sample number."""

    def __init__(self, path: str | Path, integrity: str = "shard", remote=None) -> None:
        self._remote_cfg, self.url = None, None
        path = user_path(path)
        if is_url(path):   # object storage: shards are fetched into a bounded local folder (stores/fetch.py)
            from ..stores.fetch import RemoteConfig

            self.url, self._remote_cfg = str(path).rstrip("/"), remote or RemoteConfig()
            self.manifest: Manifest = load_manifest(self.url, self._remote_cfg.storage_options)
            self.store = self._connect()
            self.path = self.store.folder
        else:
            refuse_url(path, "cache")
            self.path = Path(path)
            self.manifest = load_manifest(self.path)
            self.store = LocalStore(self.path, self.manifest.shards)
        counts = [s.count for s in self.manifest.shards]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.integrity = check_mode(integrity)   # integrity.py: shard (default) | sample | off
        self._shards: dict[int, Shard] = {}
        self._pid = os.getpid()
        self._table, self._lock, self._checked, self._crcs = None, threading.Lock(), {}, None
        self._hasher = ShardHasher() if integrity == "shard" else None

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_shards": {}, "_table": None, "_lock": None, "_checked": {}, "_hasher": None,
                "store": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _lock=threading.Lock())
        self._hasher = ShardHasher() if self.integrity == "shard" else None
        self.store = self._connect() if self.url else LocalStore(self.path, self.manifest.shards)

    def _connect(self):
        from ..stores.fetch import shared

        return shared(self.url, self.manifest.shards, self._remote_cfg, on_evict=self._evicted)

    def _evicted(self, i: int) -> None:
        """The shard folder deleted shard i's file: forget its mapping (readers holding it keep theirs)."""
        self._shards.pop(i, None)
        self._checked.pop(i, None)
        if self._table:
            self._table.retire(i)

    def read_ahead(self, shard_ids) -> None:
        """Shards in the order they will first be read: fetched ahead from object storage."""
        self.store.read_ahead(shard_ids)

    def check_integrity(self) -> None:
        """Raise a CacheFormatError for damage found so far (integrity="shard"; never waits)."""
        if self._hasher is not None:
            self._hasher.raise_if_damaged()

    def crcs(self) -> np.ndarray:
        """crc32 of every sample by global index (integrity="sample")."""
        if self._crcs is None:
            self._crcs = np.concatenate([self.shard(i).crc32 for i in range(self.num_shards)])
        return self._crcs

    def sample_name(self, index: int) -> str:
        s, j = self.locate(int(index))
        shard = self.shard(s)
        return f"{shard.path} sample {j} ({shard.keys[j]})"

    @property
    def num_shards(self) -> int:
        return len(self.manifest.shards)

    @property
    def sample_shape(self) -> tuple[int, int, int] | None:
        return self.manifest.sample_shape

    def shard(self, i: int) -> Shard:
        self._check_fork()
        shard = self._shards.get(i)
        if shard is None:
            info = self.manifest.shards[i]
            path = self.store.get(i)
            try:
                shard = self._shards[i] = open_shard(path, info, self.path)
                if self.store.evicts and self._table:   # while the store still holds the file
                    self._add_to_table(i, shard)
            finally:
                self.store.release(i)   # mapped now: the store may evict the file (and forget it here)
            if self._hasher is not None and not self.store.verified:   # (a fetched shard's sha256 was checked)
                self._hasher.submit(i, path, info.sha256, lambda: open_shard(path, info, self.path),
                                    int(self.starts[i]))
        return shard

    def locate(self, index: int) -> tuple[int, int]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range for a cache of {len(self)} samples")
        s = bisect.bisect_right(self.starts, index) - 1
        return s, index - int(self.starts[s])

    def raw(self, index: int) -> tuple[torch.Tensor, int]:
        """The stored bytes of one sample (pixels, JPEG or file bytes) and its label."""
        s, j = self.locate(index)
        shard = self.shard(s)
        return shard.sample(j), int(shard.labels[j])

    def labels(self) -> np.ndarray:
        return np.concatenate([self.shard(i).labels for i in range(self.num_shards)]) if self.num_shards else \
            np.zeros(0, np.int64)

    def gather_table(self):
        """The one-call batch gather table of a fixed-shape raw cache (gather.py, table.py): reserved
        once per process, filled as shards are mapped; None where it does not apply."""
        if self.manifest.kind != "raw" or self.sample_shape is None:
            return None
        self._check_fork()
        if self._table is None:
            from .table import ShardTable, TableFull

            with self._lock:
                if self._table is None:
                    try:
                        self._table = ShardTable([s.bytes for s in self.manifest.shards],
                                                 [s.count for s in self.manifest.shards],
                                                 int(np.prod(self.sample_shape)))
                    except TableFull:
                        self._table = False
        return self._table or None

    def _check_fork(self) -> None:
        """In a forked process: mappings are inherited and fine, but handles and the table are per process."""
        if self._pid != os.getpid():
            self._shards, self._table, self._checked, self._pid = {}, None, {}, os.getpid()

    def pin_in_table(self, shard_ids) -> bool:
        """Map (fetching if need be) and pin these shards in the gather table for one gather; the caller
        releases them. False: the table cannot take them, copy shard by shard instead."""
        table = self.gather_table()
        for _ in range(4):          # a store may evict a shard between its mapping and the pin: again
            if table is None or not self._table:
                return False
            if table.acquire(shard_ids):
                return True
            for i in (int(i) for i in shard_ids if int(i) not in table.mapped):
                if self.store.evicts:
                    # the file may be gone since it was opened: fetch it afresh; shard() maps it while the
                    # store still holds it (mapping it here could find it evicted again)
                    self._shards.pop(i, None)
                    self.shard(i)
                elif not self._add_to_table(i, self.shard(i)):
                    return False
        return False

    def _add_to_table(self, i: int, shard) -> bool:
        """Map shard i into the gather table; False (and the table off for good) where it cannot be."""
        from .table import TableFull

        try:
            self._table.add(i, shard)
            return True
        except TableFull as e:
            log.debug("gather table off for %s: %s", self.path, e)
            self._table = False
            return False

    def check_unchanged(self, shard_ids=None, max_age: float = 0.0) -> None:
        """Raise if a mapped shard was replaced or resized on disk (a cache rebuilt under a reader).

        Reading a memory-mapped file that shrank kills the process with SIGBUS, so
        loaders call this before touching a shard rather than finding out that way.
        max_age > 0 skips shards that passed a check less than max_age seconds ago: each
        check is a stat() that gives up the GIL, which a reader must then win back.
        A shard folder that evicts (object storage) is never checked: its files are ours, published
        by rename after a sha256 check and evicted by unlink, so a mapped file never shrinks; and its
        eviction unlinks before it tells this cache, so a stat() between the two found a shard
        'changed' that had only been evicted (a CI failure).
        """
        if self.store.evicts:
            return
        now_t = time.monotonic()
        for i in (self._shards if shard_ids is None else shard_ids):
            shard = self._shards.get(int(i))
            if shard is None or (max_age and now_t - self._checked.get(int(i), -1e9) < max_age):
                continue
            try:
                st = shard.path.stat()
                now = (st.st_size, st.st_ino, st.st_mtime_ns)
            except OSError:
                now = (-1, -1, -1)
            if now != shard.stat:
                raise CacheFormatError(f"{shard.path}: changed on disk while being read (size {shard.stat[0]} -> "
                                       f"{now[0]} B); do not rebuild or move a cache that a job is reading")
            self._checked[int(i)] = now_t


def open_cache(path: str | Path, integrity: str = "shard", remote=None) -> Cache:
    """Open a cache folder written by `fastdata build-cache`, or an s3:// cache (remote: a
    stores.fetch.RemoteConfig; credentials from the environment when None). integrity: integrity.py."""
    return Cache(path, integrity, remote)
