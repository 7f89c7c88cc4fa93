"""Per-image crop boxes for decoders that yield images of different sizes (nvJPEG, PIL)."""
from __future__ import annotations

import math

import numpy as np

from ..data.augment import AugmentConfig


def crop_box(h: int, w: int, cfg: AugmentConfig, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(top, left, height, width): RandomResizedCrop (10 tries, then centre) or the eval centre crop."""
    if not cfg.train:
        side = max(1, round(min(h, w) * cfg.crop_fraction))
        return (h - side) // 2, (w - side) // 2, side, side
    area = h * w
    lo, hi = math.log(cfg.ratio[0]), math.log(cfg.ratio[1])
    for _ in range(10):
        target = area * rng.uniform(*cfg.scale)
        r = math.exp(rng.uniform(lo, hi))
        cw, ch = round(math.sqrt(target * r)), round(math.sqrt(target / r))
        if 0 < cw <= w and 0 < ch <= h:
            return int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1)), ch, cw
    side = min(h, w)
    return (h - side) // 2, (w - side) // 2, side, side
