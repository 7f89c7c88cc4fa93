"""Backend pil: JPEG files or a JPEG cache decoded by PIL in the reader threads (GIL released).

The CPU fallback. It uses the build's decode (EXIF rotation, 16-bit, CMYK,
alpha handled alike: cache/codecs.py), a draft decode where the crop allows,
then a random-resized crop straight to the output size.
"""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from ...cache.codecs import open_rgb
from ...errors import LoaderError, SampleError
from ..augment import AugmentConfig, normalize
from ..crop_box import crop_box
from ..encoded import EncodedSource
from . import BaseBackend
from .decode import batch_rng, read_encoded, source_attrs


def _pil_decode(data: np.ndarray, rng: np.random.Generator, cfg: AugmentConfig, name: str) -> np.ndarray:
    try:
        img = open_rgb(data.tobytes(), draft=cfg.size)
    except SampleError as e:
        raise LoaderError(f"{name}: {e}; fix or remove the file, or build a cache first (fastdata build-cache "
                          f"quarantines undecodable files)") from None
    t, left, h, w = crop_box(img.height, img.width, cfg, rng)
    return np.asarray(img.resize((cfg.size, cfg.size), Image.BILINEAR, box=(left, t, left + w, t + h)))


class PilBackend(BaseBackend):
    kind = "pil"

    def __init__(self, source: EncodedSource, cfg, device: torch.device) -> None:
        source_attrs(self, source, "pil")
        self.cfg, self.device = cfg, device

    def read(self, key, idx: np.ndarray, _slot):
        aug = self.cfg.augment
        rng = batch_rng(self.cfg.seed, key, self.cfg.batch_size)
        encoded, labels, flips = read_encoded(self.encoded, idx, aug, rng)
        pixels = np.stack([_pil_decode(e, rng, aug, self.encoded.name(i)) for e, i in zip(encoded, idx)])
        return torch.from_numpy(pixels), labels, flips

    def stage(self, _slot, out, _n):
        pixels, labels, flips = out
        return normalize(pixels.to(self.device), self.cfg.augment, flips.to(self.device)), labels.to(self.device)

    def finish(self, staged, _idx):
        return staged
