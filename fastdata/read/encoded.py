"""Encoded images by global index, from a build source (image folder, file list, tar) or a JPEG cache.

A build source is read through the same Source the build uses
(cache/sources.py: items of (path, key, label, span), read_item() for their
bytes), so anything the build can read, the decoding backends can read
without a cache: a WebDataset-style tar is read in place by offset.

Both GPU-decode backends read through this, and order batches with the read
side's SampleOrder, so they share its shuffle, rank split, resume state and
coverage audit with fastdata.loader.
"""
from __future__ import annotations

import io
import logging
import threading
from pathlib import Path

import numpy as np

from ..cache.jpeg_header import baseline_sizes
from ..cache.sources import Source, discover, read_item
from .reader import open_cache
from .sample_index import SampleIndex
from .select import is_cache
from .spans import EncodedBatch
from ..errors import LoaderError

log = logging.getLogger("fastdata.read")


class EncodedSource:
    """source.get(i) -> (encoded bytes as a uint8 array, label)."""

    def __init__(self, path: str | Path | Source, integrity: str = "shard", *,
                 allow_empty_classes: bool = False) -> None:
        self.cache = self.items = None
        if isinstance(path, Source):
            src, path = path, Path(path.items[0].path).parent if path.items else Path(".")
        else:
            src = None
        self.path = Path(path)
        if src is None and is_cache(path):
            self.cache = open_cache(path, integrity)
            kind = self.cache.manifest.kind
            if kind == "bytes":
                raise LoaderError(f"{path}: a bytes cache holds the input files as they are, which no loader "
                                  f"backend decodes; read it with fastdata.CacheDataset in a DataLoader, or "
                                  f"rebuild with --encode raw or --encode jpeg for fastdata.loader")
            if kind != "jpeg":
                raise LoaderError(f"{path}: a {kind} cache needs no decoding; read it with backend raw, "
                                  f"or rebuild with --encode jpeg for GPU decode")
            self.shard_counts = [s.count for s in self.cache.manifest.shards]
            self.label_map = self.cache.manifest.label_map
            self.window = 16384
            self._sizes: dict[int, np.ndarray] = {}     # shard -> its JPEGs' baseline sizes (shard_sizes)
            self._sizes_lock = threading.Lock()
            # a local cache's batches in a few numpy calls (sample_index.py); an evicting store's shard by shard
            self._index = None if self.cache.store.evicts else SampleIndex(self.cache)
        else:
            src = src or discover(path, allow_empty_classes=allow_empty_classes)
            self.layout = src.layout
            self.items, self.label_map = _readable(src, self.path), src.label_map
            self.shard_counts = [len(self.items)]   # files have no locality to keep: shuffle them all
            self.window = len(self.items)

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
        return self._item_bytes(item), item.label

    def head(self, i: int, nbytes: int) -> np.ndarray:
        """The first nbytes of sample i's encoded bytes (enough for its header): a file reads no more."""
        if self.cache is not None:
            return self.get(i)[0][:nbytes]
        return self._item_bytes(self.items[int(i)], nbytes)

    @staticmethod
    def _item_bytes(item, count: int = -1) -> np.ndarray:
        """An item's bytes (the first `count` where count >= 0) as a writable uint8 array."""
        try:
            if item.span is None and "://" not in item.path:    # a plain file: one read
                return np.fromfile(item.path, dtype=np.uint8, count=count)
            data = np.frombuffer(bytearray(read_item(item)), dtype=np.uint8)
            return data if count < 0 else data[:count]
        except OSError as e:
            raise LoaderError(f"{item.path}: cannot read ({e.strerror}); the image folder changed since the "
                              f"loader started") from e

    def get_batch(self, idx) -> tuple[list[np.ndarray], np.ndarray]:
        """(encoded bytes of each sample, int64 labels) of a batch."""
        batch = self.get_spans(idx)
        return batch.arrays(), batch.labels

    def get_spans(self, idx, sizes: bool = False) -> EncodedBatch:
        """A batch as spans of its shards' buffers (spans.py): from a cache, one lookup per shard the
        batch touches and numpy arithmetic, where get() costs a Python call chain per sample and an
        array per sample; reader threads hold the GIL for those, which a launch-bound training thread
        pays (resnet18 fed from a JPEG cache on the H200 and the H100). sizes: fill the batch's
        baseline JPEG sizes from shard_sizes (a cache's; files get theirs from a header walk)."""
        idx = np.asarray(idx, dtype=np.int64)
        if self.cache is None:
            encoded, labels = zip(*(self.get(i) for i in idx)) if len(idx) else ((), ())
            return EncodedBatch.of_arrays(list(encoded), labels)
        cache = self.cache
        cache.check_integrity()
        if len(idx) and (idx.min() < 0 or idx.max() >= len(cache)):
            raise IndexError(f"{self.path}: sample index out of range for a cache of {len(cache)} samples")
        if self._index is not None:
            return self._index.spans(idx, sizes)
        which, starts, ends = (np.empty(len(idx), dtype=np.int64) for _ in range(3))
        labels = np.empty(len(idx), dtype=np.int64)
        hw = np.empty((len(idx), 2), dtype=np.int64) if sizes else None
        shard_of = np.searchsorted(cache.starts, idx, side="right") - 1
        buffers = []
        for s in np.unique(shard_of).tolist():
            pos = np.flatnonzero(shard_of == s)
            shard = cache.shard(s)
            local = idx[pos] - int(cache.starts[s])
            labels[pos] = shard.labels[local]
            which[pos], starts[pos], ends[pos] = len(buffers), shard.offsets[local], shard.offsets[local + 1]
            buffers.append(shard.data.numpy())
            if sizes:
                hw[pos] = self.shard_sizes(s)[local]
        return EncodedBatch(tuple(buffers), which, starts, ends, labels, hw if sizes else None)

    def shard_sizes(self, s: int) -> np.ndarray:
        """(n, 2) int64 (height, width) of shard s's baseline colour JPEGs, -1 for any other: one numpy
        walk of the whole shard's headers on first use, then a lookup. Walked per batch instead, the
        reader threads held the GIL about as long as resnet18's training step on an H100 (py-spy:
        pyspy-share-H100-2026-12-07-summary.txt), which the launching thread waited for: every nvjpeg
        variant that needs sizes (the NVJPG engines, a CPU share) fed it at 27-50% of synthetic."""
        if self._index is not None:
            return self._index.shard_sizes(s)
        got = self._sizes.get(s)
        if got is None:
            with self._sizes_lock:
                got = self._sizes.get(s)
                if got is None:
                    shard = self.cache.shard(s)
                    offsets = np.asarray(shard.offsets, dtype=np.int64)
                    got = self._sizes[s] = baseline_sizes(shard.data.numpy(), offsets[:-1], offsets[1:])
        return got

    def name(self, i: int) -> str:
        """Where sample i comes from, for error messages."""
        if self.cache is None:
            item = self.items[int(i)]
            return str(item.path) if item.span is None else f"{item.path} member {item.key}"
        s, j = self.cache.locate(int(i))
        shard = self.cache.shard(s)
        return f"{shard.path} sample {j} ({shard.keys[j]})"

    @property
    def kind(self) -> str:
        """cache-jpeg | files | tar (members read by offset: DALI's file reader cannot take them)."""
        if self.cache is not None:
            return "cache-jpeg"
        return "tar" if self.layout == "tar" else "files"


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


def _readable(src: Source, where: Path) -> tuple:
    """The source's items less those discovery already found unreadable (a dangling link, a tar member
    with an unsafe name or without its label): a build quarantines them; read directly, each was handed
    to the decoder as the whole tar or a missing file and failed its batch. Left out with a warning."""
    bad = [it for it in src.items if it.problem]
    if not bad:
        return src.items
    if len(bad) == len(src.items):
        raise LoaderError(f"{where}: no input can be read (e.g. {bad[0].key}: {bad[0].problem})")
    log.warning("%s: %d input(s) left out, e.g. %s: %s; `fastdata build-cache` lists them all (quarantined)",
                where, len(bad), bad[0].key, bad[0].problem)
    return tuple(it for it in src.items if not it.problem)
