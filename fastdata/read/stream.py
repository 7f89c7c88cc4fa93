"""Caches bigger than memory: read shards ahead of the sample order, a window at a time, drop them behind.

A memory-mapped cache that fits in RAM is read at memory speed whatever the order. One that does
not fit thrashes: the shuffle window (16k samples, 3.2 GB at 256 px) is larger than the page
cache can hold, so samples are faulted in one at a time, at random, and evicted before the rest of
their shard is used (a 2.6 GB cache in a 900 MB cgroup streamed at 11% of the disk's rate).

Streaming mode (``LoaderConfig.memory``, on by itself when the cache is larger than half of the
memory budget: MemAvailable, or the cgroup's room, page cache included):

* the shuffle window shrinks to what fits: ``budget * WINDOW_SHARE / sample_bytes`` samples (the
  order stays shard-aware and deterministic per (seed, epoch, window), and is saved with the state);
* as each batch is submitted for reading, every shard the next batches will touch, up to the read-ahead
  budget, is read into the page cache before the first sample of it is gathered: FILL_THREADS side
  threads each map one shard and fault it in whole (``madvise(MADV_POPULATE_READ)``, no copy), in the
  order the batches need them. The first version announced them with ``posix_fadvise(WILLNEED)`` and
  let the kernel read: on the 2-core box, 16 cold shards read 1,210 MB/s that way and 2,693 MB/s by two
  populating threads (dd O_DIRECT 1,481-1,761 MB/s; ``fill-methods-cpu2-2026-12-07.md``); in the loader,
  a cache 3.2x its memory cgroup, +33-53% img/s (``out-of-ram-fill-cpu2-2026-12-07.md``). Kernels before
  5.14 lack the advice: WILLNEED again. A side thread opens each shard at the same time
  (its header and small arrays), so no reader waits on those reads: +23% img/s in a cold epoch in a
  700 MB cgroup on the 2-core box (``out-of-ram-open-ahead-cpu2-2026-12-05.md``);
* once the last batch that touches a shard has been copied out, the shard's pages are unmapped from
  the gather range (``madvise(DONTNEED)``) and dropped from the page cache (``posix_fadvise(DONTNEED)``),
  so memory stays bounded and other shards' pages are not evicted in their place.

Every sample is still read exactly once per epoch: only the window size changes.
"""
from __future__ import annotations

import mmap
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .gather import advise_mapping, madvise

WINDOW_SHARE = 0.3      # of the budget: the samples shuffled together
AHEAD_SHARE = 0.3       # of the budget: shards announced ahead of the batch being read
FILL = "populate"       # how an announced shard is read ahead: "populate" (side threads) or "advise" (WILLNEED)
FILL_THREADS = 2        # shards populated at once: 1, 2, 4 read 2,052, 2,693, 2,330 MB/s
                        # (fill-methods-cpu2-2026-12-07.md)
_MADV_DONTNEED = 4
_MADV_POPULATE_READ = 22


def populate(path) -> bool:
    """Read the whole file into the page cache from this thread (the GIL released while the kernel reads):
    map it and fault every page in, without copying a byte out. False where the kernel lacks the advice."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return True
        m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    try:
        return advise_mapping(m, size, _MADV_POPULATE_READ)
    finally:
        m.close()


def stream_window(budget: int, sample_bytes: int, batch_size: int) -> int:
    return max(4 * batch_size, int(budget * WINDOW_SHARE) // max(1, sample_bytes))


class Streamer:
    """Per pass: which shard each upcoming batch needs; advice issued as batches are submitted."""

    def __init__(self, cache, budget: int, lag: int) -> None:
        self.cache, self.budget, self.lag = cache, budget, lag
        self._fds: dict[int, int] = {}
        self._first: dict[int, int] = {}
        self._last: dict[int, int] = {}
        self._announced: set[int] = set()
        self._order: list[int] = []
        self._opener, self._opener_pid = None, 0
        self._filler, self._filler_pid, self._fills, self._populates = None, 0, {}, FILL == "populate"

    def plan(self, batch_shards: list[np.ndarray]) -> None:
        """batch_shards[k]: the shards batch k of this pass touches (k counted from the pass start)."""
        self._first, self._last, self._order = {}, {}, []
        for k, ids in enumerate(batch_shards):
            for s in np.unique(ids).tolist():
                if s not in self._first:
                    self._first[s] = k
                    self._order.append(s)
                self._last[s] = k
        self._announced &= set(self._first)

    def submitted(self, k: int) -> None:
        """Batch k of the pass is about to be read: announce what comes next, drop what is done."""
        shards = self.cache.manifest.shards
        ahead = 0
        for s in self._order:
            if self._first[s] > k and ahead + shards[s].bytes > self.budget * AHEAD_SHARE:
                break
            if self._last[s] >= k:
                ahead += shards[s].bytes if self._first[s] > k else 0
                if s not in self._announced:
                    self._fill(s)
                    self._open_ahead(s)
                    self._announced.add(s)
        done = [s for s in self._announced if self._last[s] < k - self.lag]
        for s in done:
            self._drop(s)
            self._announced.discard(s)

    def _open_ahead(self, s: int) -> None:
        """Open the announced shard on a side thread. Opening reads the file's first page and its tail (the
        small arrays), a few synchronous reads that took 6.7 ms a shard cold on the 2-core box, each
        stalling the reader that needed the shard; failures are left for that reader to raise."""
        if self._opener is None or self._opener_pid != os.getpid():   # (a forked child has no such thread)
            self._opener, self._opener_pid = ThreadPoolExecutor(1, thread_name_prefix="fastdata-open"), os.getpid()
        self._opener.submit(self.cache.shard, s)

    def _fill(self, s: int) -> None:
        """Start reading announced shard s into the page cache (FILL)."""
        if not self._populates:
            self._advise(s, os.POSIX_FADV_WILLNEED)
            return
        if self._filler is None or self._filler_pid != os.getpid():    # (a forked child has no such threads)
            self._filler = ThreadPoolExecutor(FILL_THREADS, thread_name_prefix="fastdata-fill")
            self._filler_pid, self._fills = os.getpid(), {}
        self._fills[s] = self._filler.submit(self._populate, s)

    def _populate(self, s: int) -> None:
        try:
            if populate(self.cache.path / self.cache.manifest.shards[s].name):
                return
            self._populates = False          # an older kernel: WILLNEED from now on
        except OSError:                      # a missing or unreadable shard: its reader names it
            return
        self._advise(s, os.POSIX_FADV_WILLNEED)

    def _fd(self, s: int) -> int:
        if s not in self._fds:
            self._fds[s] = os.open(self.cache.path / self.cache.manifest.shards[s].name, os.O_RDONLY)
        return self._fds[s]

    def _advise(self, s: int, advice: int) -> None:
        try:
            os.posix_fadvise(self._fd(s), 0, 0, advice)
        except OSError:   # advice is a hint: a file system without it reads on demand
            pass

    def _drop(self, s: int) -> None:
        fill = self._fills.pop(s, None)
        if fill is not None and not fill.cancel():
            fill.result()                    # still populating: let it end, or its pages would stay
        table = self.cache.gather_table()
        if table is not None and table.base:
            start, size = table.starts[s], table.sizes[s]
            madvise(table.base + start, size, _MADV_DONTNEED)
        self._advise(s, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        if self._filler is not None:
            self._filler.shutdown(wait=True, cancel_futures=True)
            self._filler, self._fills = None, {}
        if self._opener is not None:
            self._opener.shutdown(wait=True, cancel_futures=True)
            self._opener = None
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
