"""A batch of encoded samples as byte spans of a few buffers, for decoders that take pointers.

A batch read from a JPEG cache is 256 slices of a handful of shard buffers. Making a numpy array of
each (EncodedSource.get_batch), then reading each array's address back, and scanning each header
in Python cost the loader's threads about a third of the GIL while resnet18 trained
(pyspy-resnet18-jpeg-H100-2026-12-05-summary.txt), and the training loop launches its kernels from
Python threads. Here a batch is (buffer, start, end) per sample: pointers, lengths and baseline
sizes come out of numpy in a few calls per buffer, and per-sample arrays are made only for a
decoder that needs them (torchvision's, PIL's).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..cache.jpeg_header import baseline_sizes


@dataclass(frozen=True)
class EncodedBatch:
    """Sample i is buffers[which[i]][starts[i]:ends[i]]; holding the batch keeps the buffers alive."""

    buffers: tuple[np.ndarray, ...]     # 1-D uint8 (a shard's data, or one sample's bytes)
    which: np.ndarray                   # int64, a buffer per sample
    starts: np.ndarray                  # int64 byte offsets in that buffer
    ends: np.ndarray
    labels: np.ndarray                  # int64
    # (n, 2) int64 (height, width) of each baseline colour JPEG, -1 where not one; None: not yet known
    # (a JPEG cache's readers fill it from a walk of each shard's headers made once: EncodedSource)
    sizes: np.ndarray | None = None
    # (path, file offset of the buffer's byte 0, file size, inode) of each buffer that maps a file, so a
    # decode process can read the samples from the file itself (decode_pool.py); None: not all buffers do
    files: tuple[tuple[str, int, int, int], ...] | None = None

    @classmethod
    def of_arrays(cls, arrays: list[np.ndarray], labels) -> "EncodedBatch":
        """One buffer per sample (files, tar members)."""
        n = len(arrays)
        return cls(tuple(arrays), np.arange(n, dtype=np.int64), np.zeros(n, np.int64),
                   np.array([a.nbytes for a in arrays], dtype=np.int64), np.asarray(labels, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.starts)

    def arrays(self) -> list[np.ndarray]:
        """A uint8 array per sample (views of the buffers)."""
        return [self.buffers[k][a:b] for k, a, b in zip(self.which.tolist(), self.starts.tolist(),
                                                           self.ends.tolist())]

    def take(self, lo: int, hi: int) -> "EncodedBatch":
        """Samples lo..hi-1 (the same buffers)."""
        return EncodedBatch(self.buffers, self.which[lo:hi], self.starts[lo:hi], self.ends[lo:hi],
                            self.labels[lo:hi], None if self.sizes is None else self.sizes[lo:hi], self.files)

    def nbytes(self) -> int:
        return int((self.ends - self.starts).sum())

    def packed(self, room: np.ndarray) -> "EncodedBatch":
        """The batch copied back to back into `room` (1-D uint8 of at least nbytes()): one buffer, so
        a decoder given pointers() reads wherever room lives. nvjpeg.py packs into pinned memory: from
        pageable memory nvJPEG's hardware backend copies each image with a host-synchronous pageable
        cudaMemcpyAsync (benchmarks/hw_output.py). memoryview slices copy holding the GIL once, where
        numpy's copies would release and retake it per sample (a wait behind the training thread each)."""
        lens = self.ends - self.starts
        starts = np.zeros(len(self), np.int64)
        np.cumsum(lens[:-1], out=starts[1:])
        dst, srcs = memoryview(room), [memoryview(b) for b in self.buffers]
        for k, a, b, o in zip(self.which.tolist(), self.starts.tolist(), self.ends.tolist(), starts.tolist()):
            dst[o:o + b - a] = srcs[k][a:b]
        return EncodedBatch((room[:int(lens.sum())],), np.zeros(len(self), np.int64), starts, starts + lens,
                            self.labels, self.sizes)

    def pointers(self) -> tuple[np.ndarray, np.ndarray]:
        """(host address, length) of every sample, as uint64 arrays."""
        base = np.array([b.__array_interface__["data"][0] for b in self.buffers], dtype=np.uint64)
        return base[self.which] + self.starts.astype(np.uint64), (self.ends - self.starts).astype(np.uint64)

    def baseline_sizes(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(heights, widths) when every sample is a baseline 8-bit colour JPEG (what the NVJPG engines
        take), else None. Walked here (numpy, ~1 ms of GIL a batch of 256 on the CPU box) unless the reader knew them."""
        hw = self.sizes
        if hw is None:
            hw = np.empty((len(self), 2), dtype=np.int64)
            for k in np.unique(self.which).tolist():
                mine = np.flatnonzero(self.which == k)
                hw[mine] = baseline_sizes(self.buffers[k], self.starts[mine], self.ends[mine])
        if not len(self) or (hw < 0).any():
            return None
        return hw[:, 0], hw[:, 1]
