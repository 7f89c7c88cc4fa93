"""Reader-thread work: gather one batch of samples from mapped shards into a (pinned) slot.

Raw caches, read="mmap" (default): one numpy.take for the whole batch over
every shard mapped back to back in one address range (gather.py: one GIL
release per batch, copying on this thread only). Where that table does not
apply, one numpy.take per shard the batch touches. On a 16-core GPU
machine the one-call gather is an order of magnitude faster than the
index_select per shard used before (benchmarks/loader.py; the README's
loader table).

Why not torch.index_select: from a non-main thread it opens an OpenMP team
sized for every core, so 4 readers on 16 cores ran 64 threads; one reader
gathered 11-12k img/s on the 2-core box against numpy.take's 43-45k. Why not
one copy per sample: a GIL hand-off per sample left a matmul-bound main
thread 4-7% of its solo speed beside 4 readers, against 31%.

read="pread": one os.preadv per run of consecutive samples (no page faults,
but a GIL hand-off per run; 17k img/s on the H200 machine). JPEG caches:
each sample is decoded with PIL, which releases the GIL while decoding.
"""
from __future__ import annotations

import os

import numpy as np
import torch

from ..cache.codecs import decode_jpeg_rgb
from ..errors import CacheFormatError
from .gather import gather
from .integrity import check_rows
from .reader import Cache

CHECK_EVERY_S = 0.25   # a shard found unchanged is stat()ed again after this long, not every batch


def shard_ids(cache: Cache, idx: np.ndarray) -> np.ndarray:
    """The shard holding each global index."""
    return np.searchsorted(cache.starts, idx, side="right") - 1


def _groups(cache: Cache, idx: np.ndarray):
    """(shard, local indices, batch positions) for each shard the sorted batch touches."""
    ids = shard_ids(cache, idx)
    bounds = np.flatnonzero(np.diff(ids)) + 1
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [len(idx)]])):
        s = int(ids[lo])
        yield s, idx[lo:hi] - cache.starts[s], lo, hi


def _pread_rows(shard, local: np.ndarray, out: torch.Tensor) -> None:
    """Copy fixed-size samples straight from the file into `out` (pinned) with one pread per run of
    consecutive samples. Faster than touching a memory map: no page faults in this process, and the
    kernel copies from the page cache while the GIL is released."""
    rows = out.numpy().reshape(len(local), -1)
    row_bytes = rows.shape[1]
    breaks = np.flatnonzero(np.diff(local) != 1) + 1
    for a, b in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [len(local)]])):
        start = shard.data_offset + int(shard.offsets[local[a]])
        got = os.preadv(shard.fd(), [memoryview(rows[a:b])], start)
        if got != (b - a) * row_bytes:
            raise CacheFormatError(f"{shard.path}: short read at sample {int(local[a])} ({got} of "
                                   f"{(b - a) * row_bytes} B); the shard is truncated, run fastdata verify")


def _claim(cache: Cache, slot: dict) -> None:
    """Before a reader writes into a slot: the previous copy out of it is done, and no damage was found."""
    copied = slot.get("copied")
    if copied is not None:
        copied.synchronize()  # host wait, in this reader thread: the previous copy out of the slot is done
    cache.check_integrity()


def fill_batch(cache: Cache, idx: np.ndarray, slot: dict, read: str = "mmap") -> None:
    """Write samples idx (sorted global indices) into slot['images'][:n], labels into slot['labels']."""
    _claim(cache, slot)
    images, labels = slot["images"], slot["labels"]
    _fill(cache, idx, images, labels, read)
    if cache.integrity == "sample" and cache.manifest.kind == "raw":
        rows = images[:len(idx)].numpy().reshape(len(idx), -1)
        check_rows(rows, cache.crcs()[idx], lambda k: cache.sample_name(idx[k]))


def _fill(cache: Cache, idx: np.ndarray, images: torch.Tensor, labels: torch.Tensor, read: str) -> None:
    table = cache.gather_table() if read == "mmap" else None
    ids = np.unique(shard_ids(cache, idx)) if table is not None else None
    if table is not None and cache.pin_in_table(ids):   # the whole batch in one call: one GIL release (gather.py)
        try:
            cache.check_unchanged(ids, max_age=CHECK_EVERY_S)
            labels[:len(idx)] = torch.from_numpy(table.labels[idx])
            gather(table, idx, images.numpy())
        finally:
            table.release(ids)
        return
    shape = cache.sample_shape
    for s, local, lo, hi in _groups(cache, idx):
        shard = cache.shard(s)
        cache.check_unchanged([s])
        labels[lo:hi] = torch.from_numpy(shard.labels[local])
        if cache.manifest.kind == "raw" and read == "pread" and shard.data_offset is not None:
            _pread_rows(shard, local, images[lo:hi])
        elif cache.manifest.kind == "raw":
            view = shard.block(0, len(shard), shape).numpy()
            # mode="clip" writes straight into the slot (mode="raise" buffers a copy); local indices
            # come from the manifest's counts and open_shard checked the data size, so none clips.
            np.take(view, local, axis=0, out=images[lo:hi].numpy(), mode="clip")
        else:
            for pos, j in zip(range(lo, hi), local):
                data = shard.sample(int(j)).numpy()
                if cache.integrity == "sample":
                    check_rows(data[None], shard.crc32[[j]], lambda k: f"{shard.path} sample {int(j)}")
                arr = decode_jpeg_rgb(data)
                if arr.shape != tuple(shape):
                    raise CacheFormatError(f"{shard.path}: sample {int(j)} decodes to {arr.shape}, "
                                           f"manifest says {tuple(shape)}; rebuild the cache")
                images[pos].numpy()[...] = arr


def fill_packed(cache: Cache, idx: np.ndarray, slot: dict, grow) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Variable-shape raw caches (--resize short|max): samples idx packed end to end into the flat
    slot['images'] (grown with grow(nbytes) when a batch needs more room), labels into slot['labels'].
    Returns each sample's (height, width, byte offset) for its crop plan (augment.apply_plan)."""
    _claim(cache, slot)
    n = len(idx)
    hw = np.zeros((n, 2), np.int64)
    sizes = np.zeros(n, np.int64)
    groups = [(cache.shard(s), s, local, lo, hi) for s, local, lo, hi in _groups(cache, idx)]
    for shard, s, local, lo, hi in groups:
        cache.check_unchanged([s], max_age=CHECK_EVERY_S)
        hw[lo:hi] = shard.shapes[local, :2]
        sizes[lo:hi] = shard.offsets[local + 1] - shard.offsets[local]
        slot["labels"][lo:hi] = torch.from_numpy(shard.labels[local])
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    total = int(sizes.sum())
    if total > slot["images"].numel():
        slot["images"] = grow(total)
    flat = slot["images"].numpy()
    for shard, _, local, lo, hi in groups:
        data = shard.data.numpy()
        for k, j in zip(range(lo, hi), local):
            row = flat[offsets[k]:offsets[k] + sizes[k]]
            row[:] = data[int(shard.offsets[j]):int(shard.offsets[j + 1])]
            if cache.integrity == "sample":
                check_rows(row[None], shard.crc32[[j]], lambda _, k=k: cache.sample_name(idx[k]))
    slot["nbytes"] = total
    return hw[:, 0], hw[:, 1], offsets
