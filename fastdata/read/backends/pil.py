"""Backend pil: JPEG files or a JPEG cache decoded by PIL in the reader threads (GIL released).

The CPU fallback. It uses the build's decode (EXIF rotation, 16-bit, CMYK,
alpha handled alike: cache/codecs.py), then a random-resized crop straight to
the output size. A batch's crop boxes are drawn in one call from the images'
header sizes, as the nvjpeg and DALI backends draw them (the same windows for
the same seed, epoch and batch), and each image is decoded at the coarsest
libjpeg scale that still leaves its box the output's resolution.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

from ...cache.codecs import open_rgb
from ...errors import LoaderError, SampleError
from ..augment import AugmentConfig, normalize, to_device
from ..crop_box import crop_boxes
from ..encoded import EncodedSource
from ..header import image_sizes
from . import BaseBackend
from .decode import batch_rng, read_encoded, source_attrs


def _pil_decode(data: np.ndarray, box, size_hw, cfg: AugmentConfig, name: str) -> np.ndarray:
    """One image: decoded at the coarsest libjpeg scale that still gives its crop box cfg.size pixels
    on the short side, then the box (drawn on the header size size_hw) resized to the output."""
    t, left, bh, bw = (float(v) for v in box)
    h, w = size_hw
    draft = math.ceil(min(h, w) * cfg.size / max(1.0, min(bh, bw)))
    try:
        img = open_rgb(data.tobytes(), draft=draft)
    except SampleError as e:
        raise LoaderError(f"{name}: {e}; fix or remove the file, or build a cache first (fastdata build-cache "
                          f"quarantines undecodable files)") from None
    fx, fy = img.width / w, img.height / h       # the draft's reduction (1 where the header was right)
    area = (left * fx, t * fy, (left + bw) * fx, (t + bh) * fy)
    return np.asarray(img.resize((cfg.size, cfg.size), Image.BILINEAR, box=area))


class PilBackend(BaseBackend):
    kind = "pil"

    def __init__(self, source: EncodedSource, cfg, device: torch.device) -> None:
        source_attrs(self, source, "pil")
        self.cfg, self.device = cfg, device

    def read(self, key, idx: np.ndarray, _slot):
        aug = self.cfg.augment
        rng = batch_rng(self.cfg.seed, key, self.cfg.batch_size)
        encoded, labels, flips = read_encoded(self.encoded, idx, aug, rng)
        h, w = image_sizes(encoded)
        boxes = crop_boxes(h, w, aug, rng)    # the whole batch in one draw, as nvjpeg
        pixels = np.stack([_pil_decode(e, b, hw, aug, self.encoded.name(i))
                           for e, b, hw, i in zip(encoded, boxes, zip(h, w), idx)])
        out = torch.from_numpy(pixels), labels, flips
        if self.device.type == "cuda":   # pinned here, in the reader thread: the upload then waits for nothing
            out = tuple(t.pin_memory() for t in out)
        return out

    def stage(self, _slot, out, _n):
        pixels, labels, flips = (to_device(t, self.device) for t in out)
        return normalize(pixels, self.cfg.augment, flips), labels

    def finish(self, staged, _idx):
        return staged
