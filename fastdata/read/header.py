"""An encoded image's decoded size from its header, without decoding it.

The decoding backends draw each batch's crop boxes before decoding (one vectorised draw per batch,
the same for pil, nvjpeg and DALI); they need every image's size as the decoder will return it,
that is after its EXIF orientation, which PIL's open_rgb and DALI's decoders both apply.
"""
from __future__ import annotations

import io

import numpy as np

from ..cache.jpeg_header import jpeg_frame


def image_size(encoded) -> tuple[int, int]:
    """(height, width) as decoded, from a JPEG's headers without decoding: the frame size, turned by a
    quarter when the EXIF orientation says so (DALI's decoders apply it); other formats through PIL's
    header read; (1, 1) for bytes neither can read (the decoder then names the sample)."""
    frame = jpeg_frame(encoded)
    if frame is not None:
        h, w, _, _, orientation = frame
        return (w, h) if orientation in (5, 6, 7, 8) else (h, w)
    try:
        from PIL import Image

        img = Image.open(io.BytesIO(memoryview(encoded).cast("B").tobytes()))       # reads the header only
        w, h = img.size
        return (w, h) if img.getexif().get(0x0112, 1) in (5, 6, 7, 8) else (h, w)
    except Exception:  # noqa: BLE001 - undecodable: DALI fails on it and undecodable() names it
        return 1, 1


def image_sizes(encoded) -> tuple[np.ndarray, np.ndarray]:
    """(heights, widths) int64 of a batch of encoded images, each by image_size."""
    hw = np.array([image_size(e) for e in encoded], dtype=np.int64).reshape(-1, 2)
    return hw[:, 0], hw[:, 1]
