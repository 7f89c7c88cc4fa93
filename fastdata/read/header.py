"""An encoded image's decoded size from its header, without decoding it.

The decoding backends draw each batch's crop boxes before decoding (one vectorised draw per batch,
the same for pil, nvjpeg and DALI); they need every image's size as the decoder will return it,
that is after its EXIF orientation, which PIL's open_rgb and DALI's decoders both apply.
"""
from __future__ import annotations

import io

import numpy as np

_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def jpeg_frame(encoded) -> tuple[int, int, int, int, int] | None:
    """(height, width, components, bits per sample, EXIF orientation) of a JPEG's frame as stored
    (before orientation), from its headers; None when the bytes are not a JPEG with a frame header."""
    b = memoryview(encoded).cast("B")
    i, n, orientation = 2, len(b), 1
    if not (n > 3 and b[0] == 0xFF and b[1] == 0xD8):
        return None
    while i + 9 < n:
        if b[i] != 0xFF:
            i += 1
        elif b[i + 1] in _SOF:
            return (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8], b[i + 9], b[i + 4], orientation
        elif b[i + 1] == 0xFF or b[i + 1] == 0x01 or 0xD0 <= b[i + 1] <= 0xD8:
            i += 1 if b[i + 1] == 0xFF else 2      # fill byte, or a marker without a length
        else:
            length = (b[i + 2] << 8) | b[i + 3]
            if b[i + 1] == 0xE1 and orientation == 1:
                orientation = _exif_orientation(b[i + 4:i + 2 + length])
            i += 2 + length
    return None


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


def _exif_orientation(seg: memoryview) -> int:
    """The Orientation tag (0x0112) of an APP1 Exif segment's first IFD; 1 (upright) when absent."""
    if len(seg) < 14 or bytes(seg[:6]) != b"Exif\0\0":
        return 1
    tiff = seg[6:]
    order = "little" if bytes(tiff[:2]) == b"II" else "big"

    def num(at: int, size: int) -> int:
        return int.from_bytes(tiff[at:at + size], order) if at + size <= len(tiff) else 0

    ifd = num(4, 4)
    for k in range(num(ifd, 2)):
        entry = ifd + 2 + 12 * k
        if num(entry, 2) == 0x0112:
            return num(entry + 8, 2)
    return 1
