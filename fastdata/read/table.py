"""The batch-gather table, grown shard by shard as the shard store delivers shards.

gather.py says why one numpy.take per batch over one reserved address range
matters (one GIL release per batch: 11k -> 155k img/s on the H200). Wave 1
built that range by mapping every shard up front, which a cache whose shards
arrive over time cannot do: an object-storage cache keeps only a bounded part
of itself in a local folder, and a streamed cache drops finished shards. So
the range is reserved once from the manifest's shard sizes, and each shard
file is mapped into its own slot when the store hands it over:

    reserve    PROT_NONE range, one page-aligned slot per shard (manifest sizes)
    add(i)     map shard i's file over slot i (MAP_FIXED); fill its samples' rows and labels
    acquire    a batch's shards are pinned while it is gathered ...
    retire(i)  ... so a shard the store evicts is unmapped only once no gather uses it

The row width (granule) divides the sample size and every mapped sample's
place in the range; a shard that needs a finer grid gets a new snapshot of
it (gathers already running keep theirs). Rows under MIN_GRANULE turn the
table off: readers then copy shard by shard.
"""
from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
import threading
import weakref
from collections import Counter

import numpy as np

from .gather import _PROT_NONE, _PROT_READ, _MAP_ANON, _MAP_FIXED, _MAP_NORESERVE, _MAP_PRIVATE, _MAP_SHARED, \
    MIN_GRANULE, _libc, _Range


class TableFull(Exception):
    """This shard cannot join the table (see the module docstring): readers fall back."""


class ShardTable:
    def __init__(self, sizes: list[int], counts: list[int], sample_bytes: int) -> None:
        if not sys.platform.startswith("linux"):
            raise TableFull("the table needs Linux mmap")
        page = mmap.PAGESIZE
        spans = [-(-max(int(s), 1) // page) * page for s in sizes]
        self.total = sum(spans)
        libc = _libc()
        base = libc.mmap(None, self.total, _PROT_NONE, _MAP_PRIVATE | _MAP_ANON | _MAP_NORESERVE, -1, 0)
        if base is None or base == ctypes.c_void_p(-1).value:
            raise TableFull("cannot reserve the address range")
        self.base, self.spans = base, spans
        self.starts = tuple(np.concatenate([[0], np.cumsum(spans)[:-1]]).astype(np.int64).tolist())
        self.sizes = tuple(int(s) for s in sizes)
        self.sample_starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.sample_bytes = sample_bytes
        self.addr = np.full(int(self.sample_starts[-1]), -1, dtype=np.int64)   # each sample's place in the range
        self.labels = np.zeros(int(self.sample_starts[-1]), dtype=np.int64)
        # (view, first row of each sample, granule, rows per sample): replaced whole when a shard makes
        # the grid finer, so a gather that read it keeps a consistent one
        self.grid: tuple | None = None
        self.mapped: set[int] = set()
        self._use: Counter = Counter()
        self._retired: set[int] = set()
        self._lock = threading.Lock()
        weakref.finalize(self, libc.munmap, base, self.total)   # the range goes with the table

    def add(self, i: int, shard) -> None:
        """Map shard i (an open Shard: path, data_offset, offsets, labels, stat) into its slot."""
        with self._lock:
            if i in self.mapped:
                self._retired.discard(i)
                return
            size = int(shard.stat[0])
            if shard.data_offset is None or size > self.spans[i]:
                raise TableFull(f"{shard.path}: no known data offset, or larger than the manifest says")
            addr = self.starts[i] + shard.data_offset + shard.offsets[:-1].astype(np.int64)
            g = math.gcd(self.sample_bytes, int(np.gcd.reduce(addr)) if len(addr) else self.sample_bytes)
            g = g if self.grid is None else math.gcd(g, self.grid[2])
            if g < MIN_GRANULE:
                raise TableFull(f"{shard.path}: rows of {g} B are too narrow to gather fast")
            self._map(i, shard.path, size)
            lo, hi = self.sample_starts[i], self.sample_starts[i + 1]
            self.addr[lo:hi] = addr
            self.labels[lo:hi] = shard.labels
            if self.grid is None or g != self.grid[2]:   # a new, finer grid: a new snapshot for later gathers
                rows = np.where(self.addr >= 0, self.addr // g, -1)
                self.grid = (np.asarray(_Range(self.base, self.total // g, g)), rows, g, self.sample_bytes // g)
            else:
                self.grid[1][lo:hi] = addr // g
            self.mapped.add(i)
            self._retired.discard(i)

    @property
    def view(self):
        return self.grid[0] if self.grid else None

    @property
    def first_row(self):
        return self.grid[1] if self.grid else None

    @property
    def rows_per_sample(self):
        return self.grid[3] if self.grid else None

    def _map(self, i: int, path, size: int) -> None:
        if size == 0:
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            got = _libc().mmap(self.base + self.starts[i], size, _PROT_READ, _MAP_SHARED | _MAP_FIXED, fd, 0)
        finally:
            os.close(fd)
        if got != self.base + self.starts[i]:
            raise TableFull(f"{path}: mmap into the table failed")

    def acquire(self, ids) -> bool:
        """Pin shards ids for a gather; False when one is not mapped (the caller maps it and retries)."""
        with self._lock:
            if any(int(i) not in self.mapped for i in ids):
                return False
            self._use.update(int(i) for i in ids)
            return True

    def release(self, ids) -> None:
        with self._lock:
            for i in ids:
                i = int(i)
                self._use[i] -= 1
                if self._use[i] <= 0:
                    del self._use[i]
                    if i in self._retired:
                        self._unmap(i)

    def retire(self, i: int) -> None:
        """The store evicted shard i's file: unmap its slot now, or after the last gather using it."""
        with self._lock:
            if i not in self.mapped:
                return
            if self._use[i] > 0:
                self._retired.add(i)
            else:
                self._use.pop(i, None)
                self._unmap(i)

    def _unmap(self, i: int) -> None:
        """Back to PROT_NONE: the file's pages and its disk space are let go."""
        _libc().mmap(self.base + self.starts[i], self.spans[i], _PROT_NONE,
                     _MAP_PRIVATE | _MAP_ANON | _MAP_NORESERVE | _MAP_FIXED, -1, 0)
        lo, hi = self.sample_starts[i], self.sample_starts[i + 1]
        self.addr[lo:hi] = -1
        self.grid[1][lo:hi] = -1
        self.mapped.discard(i)
        self._retired.discard(i)
