"""Resumable random-resized crops for DALI: each sample's window and flip drawn on the host.

DALI's own random operators draw from the pipeline's seed, so a pipeline rebuilt after
load_state_dict() would crop and flip differently from the uninterrupted run. Here every batch's
flips and crop boxes come from the batch's generator, a pure function of (seed, epoch, batch
number), drawn as the nvjpeg backend draws them (crop_box.crop_boxes over the batch in sorted index
order), and reach the graph through ``fn.external_source``; ``fn.decoders.image_slice`` then
decodes only that window.

The boxes need each image's size before decoding: a JPEG cache has one fixed shape, and otherwise
the size is read from the image's header (header.image_size). An earlier version computed the windows
inside the DALI graph from the peeked shape, about 20 CPU operators per sample: with the decoding
on the GPU that capped the loader near 11k img/s on the H200, where windows fed from the host let a
JPEG cache decode at 24.5-25.7k (results/decode-dali-hostwindows-H200-2026-12-04.md).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from itertools import cycle

import numpy as np

from ..augment import AugmentConfig
from ..crop_box import crop_boxes
from ..header import image_size
from .decode import batch_rng, draw_flips


def host_windows(h, w, aug: AugmentConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """[anchor (n, 2) x/y, shape (n, 2) w/h as float32, mirror (n,) int32] for images of heights h and
    widths w: the flips, then crop_boxes, from one generator, as the nvjpeg backend draws them."""
    h, w = np.asarray(h, dtype=np.int64), np.asarray(w, dtype=np.int64)
    flips = draw_flips(len(h), aug, rng)
    boxes = crop_boxes(h, w, aug, rng)
    return [np.ascontiguousarray(boxes[:, [1, 0]], dtype=np.float32),
            np.ascontiguousarray(boxes[:, [3, 2]], dtype=np.float32), flips.astype(np.int32)]


def batch_windows(idx: np.ndarray, h, w, aug: AugmentConfig, seed: int, key, batch_size: int,
                  rows: int | None = None) -> list[np.ndarray]:
    """The windows of one planned batch: sample indices idx and their image heights h and widths w, in
    plan order; key = (epoch, position). Drawn in sorted index order, as the other backends read a
    batch, then put back in plan order and padded to `rows` by repeating the last sample (the native
    reader's padding)."""
    ranks = np.argsort(idx, kind="stable")
    drawn = host_windows(np.asarray(h)[ranks], np.asarray(w)[ranks], aug, batch_rng(seed, key, batch_size))
    back = np.argsort(ranks)
    pad = (rows or len(idx)) - len(idx)
    return [np.ascontiguousarray(np.concatenate([a[back], np.repeat(a[back][-1:], pad, axis=0)])) for a in drawn]


HEAD_BYTES = 1 << 16      # bytes read for a header: a JPEG's frame header sits within them but for big EXIF/ICC


class HeaderSizes:
    """(heights, widths) of image files by sample index, read from their headers once and kept (8 bytes
    a sample: 10 MB for ImageNet's 1.28M)."""

    def __init__(self, source) -> None:
        self.source = source
        self.h = np.zeros(len(source), dtype=np.int32)
        self.w = np.zeros(len(source), dtype=np.int32)

    def __call__(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        for i in idx[self.h[idx] == 0].tolist():
            self.h[i], self.w[i] = self._read(i)
        return self.h[idx], self.w[idx]

    def _read(self, i: int) -> tuple[int, int]:
        """From the file's first HEAD_BYTES (DALI reads the whole file again anyway); the whole file only
        where the frame header lies further in (large EXIF or ICC segments first)."""
        head = self.source.head(i, HEAD_BYTES)
        size = image_size(head)
        if size == (1, 1) and len(head) == HEAD_BYTES:
            size = image_size(self.source.get(i)[0])
        return size


class WindowFeed:
    """external_source callable for DALI's native file reader, whose bytes never reach Python: each
    planned batch's windows, from the images' header sizes, read a few batches ahead in threads. Past
    the end of the plan (DALI prefetches beyond it before the pipeline is rebuilt) the reader wraps to
    the list's start, and so do the windows; those batches are never yielded."""

    def __init__(self, planned, sizes: HeaderSizes, aug: AugmentConfig, seed: int, batch_size: int,
                 threads: int, ahead: int) -> None:
        self.args = (sizes, aug, seed, batch_size)
        self.pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="fastdata-dali-windows")
        self.planned = cycle(planned)
        self.pending = [self.pool.submit(self._windows, next(self.planned)) for _ in range(max(1, ahead))]

    def _windows(self, p):
        sizes, aug, seed, bs = self.args
        return batch_windows(p.idx, *sizes(p.idx), aug, seed, (p.epoch, p.position), bs, rows=bs)

    def __call__(self):
        fut = self.pending.pop(0)
        self.pending.append(self.pool.submit(self._windows, next(self.planned)))
        return fut.result()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
