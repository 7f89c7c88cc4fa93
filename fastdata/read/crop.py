"""Crop plans on the host: torchvision's RandomResizedCrop boxes, vectorised over a batch.

A plan row says where output pixel (ox, oy) of one sample reads its source::

    sx = ax * ox + bx        sy = ay * oy + by        (source pixel centres, align_corners=False)

plus where the sample lies in the batch buffer (byte offset, height, width), so one
kernel serves fixed-shape batches and variable-shape ones packed end to end. A flip
is a negative ``ax``. Plans are drawn with numpy from a generator seeded per
(seed, epoch, batch) in the reader thread, next to the gather, and travel to the
GPU inside the batch's pinned slot: the augmentation is then one kernel launch,
with no per-batch random-number or parameter kernels and no host sync.

The boxes follow ``torchvision.transforms.RandomResizedCrop.get_params`` exactly:
ten tries of (area uniform in scale, log-uniform aspect), rounded to whole pixels,
the first that fits wins, a ratio-clamped centre crop otherwise; integer offsets
uniform over the positions that keep the box inside the image.
"""
from __future__ import annotations

import math

import numpy as np

PLAN_COLUMNS = 8          # ax, bx, ay, by, byte offset, height, width, (unused)
TRIES = 10                # torchvision's number of attempts before the centre-crop fallback


def random_boxes(rng: np.random.Generator, h: np.ndarray, w: np.ndarray, scale, ratio) -> np.ndarray:
    """(n, 4) int64 boxes (top, left, height, width), distributed as torchvision's get_params."""
    n = len(h)
    area = (h * w).astype(np.float64)[:, None]
    target = area * rng.uniform(scale[0], scale[1], (n, TRIES))
    aspect = np.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1]), (n, TRIES)))
    cw = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    ch = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    ok = (cw > 0) & (cw <= w[:, None]) & (ch > 0) & (ch <= h[:, None])
    first = ok.argmax(axis=1)
    rows = np.arange(n)
    bh, bw = ch[rows, first], cw[rows, first]
    fits = ok[rows, first]
    fh, fw = _fallback(h, w, ratio)
    bh, bw = np.where(fits, bh, fh), np.where(fits, bw, fw)
    u = rng.random((n, 2))
    top = np.where(fits, np.floor(u[:, 0] * (h - bh + 1)), (h - bh) // 2).astype(np.int64)
    left = np.where(fits, np.floor(u[:, 1] * (w - bw + 1)), (w - bw) // 2).astype(np.int64)
    return np.stack([top, left, bh, bw], axis=1)


def _fallback(h: np.ndarray, w: np.ndarray, ratio) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's centre-crop fallback: the whole image, its aspect clamped into `ratio`."""
    in_ratio = w / h
    fw = np.where(in_ratio < ratio[0], w, np.where(in_ratio > ratio[1], np.rint(h * ratio[1]), w))
    fh = np.where(in_ratio < ratio[0], np.rint(w / ratio[0]), h)
    return fh.astype(np.int64), fw.astype(np.int64)


def centre_boxes(h: np.ndarray, w: np.ndarray, fraction: float) -> np.ndarray:
    """Eval boxes: the central square of side fraction * min(h, w) (the usual 224/256 recipe)."""
    side = np.maximum(1, np.rint(fraction * np.minimum(h, w))).astype(np.int64)
    return np.stack([(h - side) // 2, (w - side) // 2, side, side], axis=1)


def plan_rows(boxes: np.ndarray, flips: np.ndarray, size: int, offsets: np.ndarray, h: np.ndarray,
              w: np.ndarray) -> np.ndarray:
    """(n, PLAN_COLUMNS) float64 plan: the box resized to size x size, mirrored where flips is set."""
    top, left, bh, bw = (boxes[:, k].astype(np.float64) for k in range(4))
    step_x, step_y = bw / size, bh / size
    ax = np.where(flips, -step_x, step_x)
    bx = np.where(flips, left + bw - 0.5 * step_x - 0.5, left + 0.5 * step_x - 0.5)
    by = top + 0.5 * step_y - 0.5
    plan = np.zeros((len(boxes), PLAN_COLUMNS), dtype=np.float64)
    plan[:, 0], plan[:, 1], plan[:, 2], plan[:, 3] = ax, bx, step_y, by
    plan[:, 4], plan[:, 5], plan[:, 6] = offsets, h, w
    return plan


def draw_plan(cfg, seed: int, h: np.ndarray, w: np.ndarray, offsets: np.ndarray | None = None) -> np.ndarray:
    """The plan of one batch under AugmentConfig cfg: a pure function of (seed, sizes), so resume
    and every rank reproduce it. offsets default to fixed-shape images packed back to back."""
    h, w = np.asarray(h, dtype=np.int64), np.asarray(w, dtype=np.int64)
    if offsets is None:
        offsets = np.concatenate([[0], np.cumsum(h * w * 3)[:-1]])
    if not cfg.train:
        return plan_rows(centre_boxes(h, w, cfg.crop_fraction), np.zeros(len(h), bool), cfg.size, offsets, h, w)
    rng = np.random.default_rng(seed % 2**64)
    boxes = random_boxes(rng, h, w, cfg.scale, cfg.ratio)
    flips = rng.random(len(h)) < 0.5 if cfg.flip else np.zeros(len(h), bool)
    return plan_rows(boxes, flips, cfg.size, offsets, h, w)
