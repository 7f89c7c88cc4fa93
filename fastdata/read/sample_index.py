"""Where every sample of a local JPEG cache lies, so that a batch's spans are a few numpy calls.

EncodedSource.get_spans walked a batch shard by shard (a lookup, a mask and six gathers each). A
shuffled batch of a small cache touches every shard (16 for the probes' 3,000 images), so a reader
thread held the GIL for ~100 numpy calls a batch, and a launching training thread waits behind each
(py-spy beside resnet18 on an H100, pyspy-resnet18-H100-2026-12-07-fence.txt: of the reader threads'
GIL samples, 26% in that walk, 25% copying the CPU share's JPEGs, 32% opening the shards once). Here
each shard's offsets, labels and (once wanted) baseline sizes are copied into arrays over all samples
when a batch first touches the shard, and a batch is then ~10 numpy calls however many shards it
touches. The arrays take 40 bytes a sample (51 MB for ImageNet's 1.28M).

Only for a cache on local disk: a store that evicts shards (an object-store cache with a disk budget)
maps a shard afresh after each fetch, and an array kept here would keep the old mapping alive.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from ..cache.jpeg_header import baseline_sizes
from .spans import EncodedBatch


class SampleIndex:
    def __init__(self, cache) -> None:
        self.cache = cache
        n, shards = len(cache), cache.num_shards
        self.starts, self.ends = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.labels, self.hw = np.zeros(n, np.int64), np.full((n, 2), -1, np.int64)
        self.buffers: list = [None] * shards
        # (path, file offset of data[0], size, inode) for decode_pool; None where the data is not one extent
        self.files: list = [None] * shards
        self.loaded, self.sized = np.zeros(shards, bool), np.zeros(shards, bool)
        self._lock = threading.Lock()

    def _load(self, s: int, sizes: bool) -> None:
        """Shard s's rows, once (its header walk only once sizes are wanted)."""
        with self._lock:
            lo, hi = int(self.cache.starts[s]), int(self.cache.starts[s + 1])
            shard = self.cache.shard(s)
            offsets = np.asarray(shard.offsets, dtype=np.int64)
            if not self.loaded[s]:
                self.starts[lo:hi], self.ends[lo:hi] = offsets[:-1], offsets[1:]
                self.labels[lo:hi] = shard.labels
                self.buffers[s] = shard.data.numpy()
                size, inode, _ = shard.stat
                # absolute: a decode process keeps the working directory it was forked in
                self.files[s] = None if shard.data_offset is None or not inode else \
                    (os.path.abspath(shard.path), int(shard.data_offset), int(size), int(inode))
                self.loaded[s] = True
            if sizes and not self.sized[s]:
                self.hw[lo:hi] = baseline_sizes(self.buffers[s], offsets[:-1], offsets[1:])
                self.sized[s] = True

    def spans(self, idx: np.ndarray, sizes: bool) -> EncodedBatch:
        """The batch idx (int64 global indices, in range) as spans of its shards' buffers."""
        shard_of = np.searchsorted(self.cache.starts, idx, side="right") - 1
        touched, which = np.unique(shard_of, return_inverse=True)
        wanted = ~self.loaded[touched] | (~self.sized[touched] if sizes else False)
        for s in touched[wanted].tolist():
            self._load(s, sizes)
        touched = touched.tolist()
        files = [self.files[s] for s in touched]
        return EncodedBatch(tuple(self.buffers[s] for s in touched), which.astype(np.int64),
                            self.starts[idx], self.ends[idx], self.labels[idx], self.hw[idx] if sizes else None,
                            None if None in files else tuple(files))

    def shard_sizes(self, s: int) -> np.ndarray:
        """(n, 2) baseline sizes of shard s's samples (EncodedSource.shard_sizes)."""
        if not self.sized[s]:
            self._load(s, True)
        return self.hw[int(self.cache.starts[s]):int(self.cache.starts[s + 1])]
