"""Per-image crop boxes for decoders that yield images of different sizes (nvJPEG, PIL).

The boxes come from crop.py, the one implementation of torchvision's RandomResizedCrop
distribution (and the eval centre crop) that the cache loader's plans use too."""
from __future__ import annotations

import numpy as np

from .augment import AugmentConfig
from .crop import centre_boxes, random_boxes


def crop_box(h: int, w: int, cfg: AugmentConfig, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """(top, left, height, width): RandomResizedCrop (10 tries, then torchvision's centre fallback) or
    the eval centre crop."""
    return tuple(int(v) for v in crop_boxes([h], [w], cfg, rng)[0])


def crop_boxes(h, w, cfg: AugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """(n, 4) int64 boxes (top, left, height, width) for a whole batch in one draw, without a Python
    call per image (the nvJPEG backend's GPU thread would otherwise hold the GIL for one per image,
    beside the training thread)."""
    hs, ws = np.asarray(h, dtype=np.int64), np.asarray(w, dtype=np.int64)
    if cfg.train:
        return random_boxes(rng, hs, ws, cfg.scale, cfg.ratio).astype(np.int64)
    return centre_boxes(hs, ws, cfg.crop_fraction).astype(np.int64)
