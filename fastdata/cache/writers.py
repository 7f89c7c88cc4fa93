"""Shard writers: H5ShardWriter and PtShardWriter share one add()/close() protocol.

The arrays and their layout are specified in cache/format.py. A writer buffers
one shard in memory (shards are bounded, 256 MB by default), then writes
``name.tmp``, fsyncs it and renames it into place, so a shard either exists
whole or not at all. Files are byte-deterministic (no HDF5 timestamps), which
is what lets a resumed build equal an uninterrupted one.

A shard is held once: each sample is copied into large chunks as it arrives (its bytes object is
freed at once, and the next image reuses that memory), and the chunks are written out and released
one by one. Keeping the payloads and then joining them held every shard twice in each build worker
(and a .pt shard three times): 804 MB and 1,352 MB peak for a 375 MB shard, against 1x now.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .._util import atomic_replace, file_sha256
from .format import FORMAT_VERSION, ShardInfo

CHUNK = 64 << 20   # above glibc's largest mmap threshold: a released chunk goes back to the OS at once


class _Samples:
    """The samples' bytes, back to back, in chunks that are filled in order; pages of a chunk become
    resident only as they are written."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.used = 0          # bytes filled in the last chunk
        self.nbytes = 0

    def append(self, payload: bytes) -> None:
        n = len(payload)
        if not self.chunks or self.used + n > len(self.chunks[-1]):
            if self.chunks:
                self.chunks[-1] = self.chunks[-1][:self.used]
            self.chunks.append(np.empty(max(CHUNK, n), dtype=np.uint8))
            self.used = 0
        self.chunks[-1][self.used:self.used + n] = np.frombuffer(payload, dtype=np.uint8)
        self.used += n
        self.nbytes += n

    def drain(self):
        """(start, filled chunk) in order, each chunk dropped from the buffer as it is handed out."""
        if self.chunks:
            self.chunks[-1] = self.chunks[-1][:self.used]
        start = 0
        while self.chunks:
            chunk = self.chunks.pop(0)
            yield start, chunk
            start += len(chunk)

    def joined(self) -> np.ndarray:
        """All samples as one array, built while the chunks are released (peak: the shard + one chunk)."""
        data = np.empty(self.nbytes, dtype=np.uint8)
        for start, chunk in self.drain():
            data[start:start + len(chunk)] = chunk
        return data


class _Buffer:
    def __init__(self) -> None:
        self.samples = _Samples()
        self.sizes: list[int] = []
        self.labels: list[int] = []
        self.shapes: list[tuple[int, int, int]] = []
        self.crcs: list[int] = []
        self.keys: list[str] = []

    @property
    def nbytes(self) -> int:
        return self.samples.nbytes

    def add(self, payload: bytes, label: int, shape, crc: int, key: str) -> None:
        self.samples.append(payload)
        self.sizes.append(len(payload))
        self.labels.append(label)
        self.shapes.append(tuple(shape))
        self.crcs.append(crc)
        self.keys.append(key)

    def arrays(self) -> dict[str, np.ndarray | list[str]]:
        """Every array but "data" (written from self.samples), in the order of format.ARRAYS."""
        offsets = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=offsets[1:])
        return {
            "offsets": offsets,
            "labels": np.asarray(self.labels, dtype=np.int64),
            "shapes": np.asarray(self.shapes, dtype=np.int32).reshape(-1, 3),
            "crc32": np.asarray(self.crcs, dtype=np.uint32),
            "keys": list(self.keys),
        }


class ShardWriter:
    """Collect samples for one shard; close() writes it atomically and returns its ShardInfo."""

    suffix = ""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self._buf = _Buffer()

    def add(self, payload: bytes, label: int, shape, crc: int, key: str) -> None:
        self._buf.add(payload, label, shape, crc, key)

    @property
    def count(self) -> int:
        return len(self._buf.labels)

    @property
    def nbytes(self) -> int:
        return self._buf.nbytes

    def _write(self, samples: _Samples, arrays: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> ShardInfo:
        self._write(self._buf.samples, self._buf.arrays())
        sha = atomic_replace(self.tmp, self.path, during=file_sha256)
        return ShardInfo(self.path.name, self.count, self.path.stat().st_size, sha)


class H5ShardWriter(ShardWriter):
    suffix = "h5"

    def _write(self, samples: _Samples, arrays: dict) -> None:
        import h5py

        with h5py.File(self.tmp, "w", locking=False) as f:   # (see shardfile._open_h5)
            f.attrs["format_version"] = FORMAT_VERSION
            # contiguous + uncompressed: readers memory-map "data" at its file offset. Created empty and
            # filled chunk by chunk, which gives the same bytes as create_dataset(data=...) of the whole
            data = f.create_dataset("data", shape=(samples.nbytes,), dtype=np.uint8, track_times=False)
            for start, chunk in samples.drain():
                data[start:start + len(chunk)] = chunk
            for name, arr in arrays.items():
                if name == "keys":   # bytes, so that non-UTF-8 file names (surrogate escapes) survive
                    arr = np.array([k.encode("utf-8", "surrogateescape") for k in arr],
                                   dtype=h5py.string_dtype("utf-8"))
                f.create_dataset(name, data=arr, track_times=False)


class PtShardWriter(ShardWriter):
    suffix = "pt"

    def _write(self, samples: _Samples, arrays: dict) -> None:
        import torch

        obj = {"format_version": FORMAT_VERSION, "data": torch.from_numpy(samples.joined())}
        for name, arr in arrays.items():
            obj[name] = arr if name == "keys" else torch.from_numpy(np.ascontiguousarray(arr))
        torch.save(obj, self.tmp)


WRITERS = {"h5": H5ShardWriter, "pt": PtShardWriter}
