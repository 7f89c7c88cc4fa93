"""Shard writers: H5ShardWriter and PtShardWriter share one add()/close() protocol.

The arrays and their layout are specified in cache/format.py. A writer buffers
one shard in memory (shards are bounded, 256 MB by default), then writes
``name.tmp``, fsyncs it and renames it into place, so a shard either exists
whole or not at all. Files are byte-deterministic (no HDF5 timestamps), which
is what lets a resumed build equal an uninterrupted one.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .._util import atomic_replace, file_sha256
from .format import FORMAT_VERSION, ShardInfo


class _Buffer:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.labels: list[int] = []
        self.shapes: list[tuple[int, int, int]] = []
        self.crcs: list[int] = []
        self.keys: list[str] = []
        self.nbytes = 0

    def add(self, payload: bytes, label: int, shape, crc: int, key: str) -> None:
        self.payloads.append(payload)
        self.labels.append(label)
        self.shapes.append(tuple(shape))
        self.crcs.append(crc)
        self.keys.append(key)
        self.nbytes += len(payload)

    def arrays(self) -> dict[str, np.ndarray | list[str]]:
        offsets = np.zeros(len(self.payloads) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in self.payloads], out=offsets[1:])
        data = np.frombuffer(b"".join(self.payloads), dtype=np.uint8)
        return {
            "data": data, "offsets": offsets,
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

    def _write(self, arrays: dict) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> ShardInfo:
        self._write(self._buf.arrays())
        atomic_replace(self.tmp, self.path)
        return ShardInfo(self.path.name, self.count, self.path.stat().st_size, file_sha256(self.path))


class H5ShardWriter(ShardWriter):
    suffix = "h5"

    def _write(self, arrays: dict) -> None:
        import h5py

        with h5py.File(self.tmp, "w", locking=False) as f:   # (see shardfile._open_h5)
            f.attrs["format_version"] = FORMAT_VERSION
            for name, arr in arrays.items():
                if name == "keys":   # bytes, so that non-UTF-8 file names (surrogate escapes) survive
                    arr = np.array([k.encode("utf-8", "surrogateescape") for k in arr],
                                   dtype=h5py.string_dtype("utf-8"))
                # contiguous + uncompressed: readers memory-map "data" at its file offset
                f.create_dataset(name, data=arr, track_times=False)


class PtShardWriter(ShardWriter):
    suffix = "pt"

    def _write(self, arrays: dict) -> None:
        import torch

        obj = {"format_version": FORMAT_VERSION}
        for name, arr in arrays.items():
            obj[name] = arr if name == "keys" else torch.from_numpy(np.ascontiguousarray(arr).copy())
        torch.save(obj, self.tmp)


WRITERS = {"h5": H5ShardWriter, "pt": PtShardWriter}
