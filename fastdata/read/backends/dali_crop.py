"""Resumable random-resized crops inside a DALI graph: the random numbers come from the plan.

DALI's own random operators draw from the pipeline's seed, so a pipeline rebuilt after
load_state_dict() would crop and flip differently from the uninterrupted run. Here every sample's
draws are a pure function of (seed, epoch, batch number) — the same key the cache loader and the
PIL/nvJPEG paths use — and are fed through ``fn.external_source``; the graph turns them into
torchvision's RandomResizedCrop (up to 10 tries of area and log-aspect, the first that fits wins,
else the centred square) with DALI arithmetic on the peeked image shape, then decodes only that
window with ``fn.decoders.image_slice``.

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
