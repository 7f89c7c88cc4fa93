"""Resumable random-resized crops inside a DALI graph: the random numbers come from the plan.

DALI's own random operators draw from the pipeline's seed, so a pipeline rebuilt after
load_state_dict() would crop and flip differently from the uninterrupted run. Here every sample's
draws are a pure function of (seed, epoch, batch number) — the same key the cache loader and the
PIL/nvJPEG paths use — and are fed through ``fn.external_source``; the graph turns them into
torchvision's RandomResizedCrop (up to 10 tries of area and log-aspect, the first that fits wins,
else the centred square) with DALI arithmetic on the peeked image shape, then decodes only that
window with ``fn.decoders.image_slice``. That graph serves DALI's own file reader, whose bytes
never reach Python; where they do (the Feeder: JPEG caches, fed files), the windows are drawn
on the host instead (host_windows, below), drawn as the nvjpeg backend draws them (crop_box.crop_boxes
over the batch in sorted index order, from the batch's generator), so the two crop a batch alike.

The tries are evaluated as vectors (one node per formula, not per try), which keeps the graph at
about 20 small CPU operators per batch.
"""
from __future__ import annotations

import math

import numpy as np

from ..augment import AugmentConfig

TRIES = 10


def draws(seed: int, epoch: int, batch_no: int, n: int, rows: int) -> list[np.ndarray]:
    """Per-sample uniforms of one batch, n real samples padded to `rows`: area (rows, 10),
    log-aspect (rows, 10), and (top, left, flip) (rows, 3). A sample's draws do not depend on rows."""
    rng = np.random.default_rng([seed, epoch, batch_no, 0xC0])
    u = rng.random((max(rows, n), 2 * TRIES + 3), dtype=np.float32)
    u[n:] = 0.5
    return [np.ascontiguousarray(u[:, :TRIES]), np.ascontiguousarray(u[:, TRIES:2 * TRIES]),
            np.ascontiguousarray(u[:, 2 * TRIES:])]


def crop_window(encoded, area, aspect, place, aug: AugmentConfig):
    """DALI nodes: (anchor [x, y], shape [w, h], mirror) of each sample's crop."""
    import nvidia.dali.math as dmath
    from nvidia.dali import fn, types

    shape = fn.cast(fn.peek_image_shape(encoded), dtype=types.FLOAT)
    h_img, w_img = shape[0], shape[1]
    lo, hi = math.log(aug.ratio[0]), math.log(aug.ratio[1])
    target = h_img * w_img * (float(aug.scale[0]) + area * float(aug.scale[1] - aug.scale[0]))
    ratio = dmath.exp(lo + aspect * (hi - lo))
    cw = dmath.floor(dmath.sqrt(target * ratio) + 0.5)
    ch = dmath.floor(dmath.sqrt(target / ratio) + 0.5)
    fits = (cw <= w_img) & (ch <= h_img) & (cw > 0) & (ch > 0)
    score = fn.cast(fits, dtype=types.FLOAT) * types.Constant(np.arange(TRIES, 0, -1, dtype=np.float32))
    best = fn.reductions.max(score)                          # the first try that fits scores highest
    first = fn.cast((score == best) & fits, dtype=types.FLOAT)
    found = dmath.min(best, 1.0)
    side = dmath.min(h_img, w_img)
    w = fn.reductions.sum(first * cw) + (1 - found) * side
    h = fn.reductions.sum(first * ch) + (1 - found) * side
    top = found * dmath.floor(place[0] * (h_img - h + 1)) + (1 - found) * dmath.floor((h_img - h) / 2)
    left = found * dmath.floor(place[1] * (w_img - w + 1)) + (1 - found) * dmath.floor((w_img - w) / 2)
    mirror = fn.cast(place[2] < 0.5, dtype=types.INT32) if aug.flip else 0
    return fn.stack(left, top), fn.stack(w, h), mirror


class CropFeed:
    """external_source callable for the native reader: the draws of each planned batch, in order.
    Past the end of the list (DALI may prefetch beyond it before the pipeline is rebuilt) it hands
    out neutral draws, which are never yielded."""

    def __init__(self, planned, seed: int, batch_size: int) -> None:
        self.planned, self.seed, self.batch_size = iter(planned), seed, batch_size

    def __call__(self):
        p = next(self.planned, None)
        if p is None:
            return draws(self.seed, 0, 0, 0, self.batch_size)   # n=0: every row neutral (0.5)
        return draws(self.seed, p.epoch, p.position // self.batch_size, len(p.idx), self.batch_size)


# ---- windows drawn on the host: the Feeder's path (JPEG caches, fed files) ---------------------------
# The graph above costs about 20 DALI CPU operators per sample: with the decoding on the GPU they capped
# the whole loader near 11k img/s on the H200 (a JPEG cache had decoded at 27.7k with DALI's own crop
# operator), and on the 2-core box the window graph alone ran 16k samples/s against 1.5M for windows fed
# from the host. Where the bytes pass through Python anyway, the windows are drawn there.
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def image_size(encoded) -> tuple[int, int]:
    """(height, width) from a JPEG's frame header without decoding; other formats through PIL's header
    read; (1, 1) for bytes neither can read (the decoder then names the sample)."""
    b = memoryview(encoded).cast("B")
    i, n = 2, len(b)
    if n > 3 and b[0] == 0xFF and b[1] == 0xD8:
        while i + 8 < n:
            if b[i] != 0xFF:
                i += 1
            elif b[i + 1] in _SOF:
                return (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8]
            elif b[i + 1] == 0xFF or b[i + 1] == 0x01 or 0xD0 <= b[i + 1] <= 0xD8:
                i += 1 if b[i + 1] == 0xFF else 2      # fill byte, or a marker without a length
            else:
                i += 2 + ((b[i + 2] << 8) | b[i + 3])
    try:
        import io

        from PIL import Image

        w, h = Image.open(io.BytesIO(b.tobytes())).size
        return h, w
    except Exception:  # noqa: BLE001 - undecodable: DALI fails on it and undecodable() names it
        return 1, 1


def host_windows(encoded, shape, aug: AugmentConfig, rng: np.random.Generator) -> list[np.ndarray]:
    """[anchor (n, 2) x/y, shape (n, 2) w/h as float32, mirror (n,) int32] of one batch: the flips, then
    crop_boxes, from the batch's generator, as the nvjpeg backend draws them. shape: the cache's fixed
    sample shape, or None to read each image's header."""
    from ..crop_box import crop_boxes

    n = len(encoded)
    flips = rng.random(n) < 0.5 if aug.flip else np.zeros(n, bool)
    if shape is not None:
        h, w = np.full(n, shape[0]), np.full(n, shape[1])
    else:
        h, w = (np.array(v, dtype=np.int64) for v in zip(*(image_size(e) for e in encoded))) if n else \
            (np.zeros(0, np.int64), np.zeros(0, np.int64))
    boxes = crop_boxes(h, w, aug, rng)
    return [np.ascontiguousarray(boxes[:, [1, 0]], dtype=np.float32),
            np.ascontiguousarray(boxes[:, [3, 2]], dtype=np.float32), flips.astype(np.int32)]
