"""Encoded images by global index, from an image folder or a JPEG-encoded cache.

Both GPU-decode backends read through this, and order batches with the read
side's SampleOrder, so they share its shuffle, rank split, resume state and
coverage audit with fastdata.loader.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from ..cache.sources import discover
from .reader import open_cache
from .select import is_cache
from ..errors import LoaderError


class EncodedSource:
    """source.get(i) -> (encoded bytes as a uint8 array, label)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.cache = self.items = None
        if is_cache(path):
            self.cache = open_cache(path)
            kind = self.cache.manifest.kind
            if kind != "jpeg":
                raise LoaderError(f"{path}: a {kind} cache needs no decoding; read it with fastdata.loader "
                                  f"(backend cache), or rebuild with --encode jpeg for GPU decode")
            self.shard_counts = [s.count for s in self.cache.manifest.shards]
            self.label_map = self.cache.manifest.label_map
            self.window = 16384
        else:
            src = discover(path)
            self.items, self.label_map = src.items, src.label_map
            self.shard_counts = [len(src.items)]   # files have no locality to keep: shuffle them all
            self.window = len(src.items)

    def __len__(self) -> int:
        return sum(self.shard_counts)

    def labels(self) -> np.ndarray:
        """int64 label of every sample, by global index."""
        if self.cache is not None:
            return self.cache.labels().astype(np.int64)
        return np.array([item.label for item in self.items], dtype=np.int64)

    def get(self, i: int) -> tuple[np.ndarray, int]:
        if self.cache is not None:
            data, label = self.cache.raw(int(i))
            self.cache.check_integrity()
            return data.numpy(), label
        item = self.items[int(i)]
        try:
            return np.fromfile(item.path, dtype=np.uint8), item.label
        except OSError as e:
            raise LoaderError(f"{item.path}: cannot read ({e.strerror}); the image folder changed since the "
                              f"loader started") from e

    def name(self, i: int) -> str:
        """Where sample i comes from, for error messages."""
        if self.cache is None:
            return str(self.items[int(i)].path)
        s, j = self.cache.locate(int(i))
        shard = self.cache.shard(s)
        return f"{shard.path} sample {j} ({shard.keys[j]})"

    @property
    def kind(self) -> str:
        return "cache-jpeg" if self.cache is not None else "files"


def undecodable(source: EncodedSource, idx, limit: int = 5) -> list[str]:
    """Names of the samples among idx that PIL cannot decode either (at most `limit`): run only after
    DALI failed, whose own message names no file."""
    from PIL import Image

    bad = []
    for i in dict.fromkeys(np.asarray(idx).tolist()):
        try:
            Image.open(io.BytesIO(source.get(i)[0].tobytes())).convert("RGB")
        except LoaderError:
            bad.append(source.name(i) + " (unreadable)")
        except Exception:  # noqa: BLE001 - any decoder error marks the sample as the culprit
            bad.append(source.name(i))
        if len(bad) >= limit:
            break
    return bad
