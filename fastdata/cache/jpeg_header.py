"""A JPEG's frame size, kind, components, precision and EXIF orientation from its headers, without decoding.

Shared by the readers (read/header.py: crop boxes drawn before decoding) and the GPU build decoder
(gpu_build.py: what nvJPEG may decode, and how to turn it). It lives in cache/ because read/
imports cache/, never the other way round.
"""
from __future__ import annotations

_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def jpeg_frame(encoded) -> tuple[int, int, int, int, int] | None:
    """(height, width, components, bits per sample, EXIF orientation) of a JPEG's frame as stored
    (before orientation), from its headers; None when the bytes are not a JPEG with a frame header."""
    found = jpeg_scan(encoded)
    return None if found is None else found[1:]


def baseline_size(encoded=None, *, scan=None) -> tuple[int, int] | None:
    """(height, width) of a baseline (SOF0) 8-bit 3-component JPEG, the kind nvJPEG's hardware
    backend decodes; None for any other image (progressive, grey, CMYK, 12-bit, not a JPEG).
    scan: jpeg_scan's result where the caller has it (the headers are then not read again)."""
    found = jpeg_scan(encoded) if scan is None and encoded is not None else scan
    if found is None or found[0] != 0xC0 or found[3] != 3 or found[4] != 8:
        return None
    return found[1], found[2]


def jpeg_scan(encoded) -> tuple[int, int, int, int, int, int] | None:
    """(SOF marker, height, width, components, bits per sample, EXIF orientation) from the headers:
    one pass that both baseline_size and an orientation can be taken from."""
    b = memoryview(encoded).cast("B")
    i, n, orientation = 2, len(b), 1
    if not (n > 3 and b[0] == 0xFF and b[1] == 0xD8):
        return None
    while i + 9 < n:
        if b[i] != 0xFF:
            i += 1
        elif b[i + 1] in _SOF:
            return b[i + 1], (b[i + 5] << 8) | b[i + 6], (b[i + 7] << 8) | b[i + 8], b[i + 9], b[i + 4], orientation
        elif b[i + 1] == 0xFF or b[i + 1] == 0x01 or 0xD0 <= b[i + 1] <= 0xD8:
            i += 1 if b[i + 1] == 0xFF else 2      # fill byte, or a marker without a length
        else:
            length = (b[i + 2] << 8) | b[i + 3]
            if b[i + 1] == 0xE1 and orientation == 1:
                orientation = _exif_orientation(b[i + 4:i + 2 + length])
            i += 2 + length
    return None


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


def baseline_sizes(data, starts, ends, max_segments: int = 24):
    """(n, 2) int64 (height, width) of the JPEGs at data[starts[i]:ends[i]], -1 where one is not a
    baseline 8-bit 3-component JPEG: baseline_size for a whole batch of one buffer at once.

    The readers of a JPEG cache called jpeg_scan per image, ~2 us of Python each holding the GIL that
    a launch-bound training loop needs (jpeg-trace-resnet18-H100-2026-12-05.md). This walks every
    image's marker segments in lockstep with numpy: the same walk, by segment lengths, so where it
    finds a frame header it is the one jpeg_scan finds; an image it cannot follow (fill bytes,
    markers without a length, more segments than max_segments) goes to jpeg_scan."""
    import numpy as np

    data = np.asarray(data, dtype=np.uint8)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    out = np.full((len(starts), 2), -1, dtype=np.int64)
    pos, left = starts + 2, np.flatnonzero(ends - starts > 3)
    soi = (data[starts[left]] == 0xFF) & (data[starts[left] + 1] == 0xD8)
    left = left[soi]

    def by_scan(images) -> None:
        for i in images.tolist():
            hw = baseline_size(scan=jpeg_scan(data[starts[i]:ends[i]]))
            if hw is not None:
                out[i] = hw

    walk = np.zeros(256, bool)
    walk[[m for m in range(0xC0, 0xFF) if m not in _SOF and m != 0xD8 and not 0xD0 <= m <= 0xD7]] = True
    for _ in range(max_segments):
        left = left[pos[left] + 9 < ends[left]]        # too short for a frame header: not one
        if not len(left):
            break
        p = pos[left]
        at = data[p[:, None] + np.arange(10)].astype(np.int64)     # marker, length / frame header bytes
        sof = (at[:, 0] == 0xFF) & (at[:, 1] == 0xC0)
        other_sof = (at[:, 0] == 0xFF) & np.isin(at[:, 1], list(_SOF - {0xC0}))
        good = sof & (at[:, 9] == 3) & (at[:, 4] == 8)
        out[left[good], 0] = (at[good, 5] << 8) | at[good, 6]
        out[left[good], 1] = (at[good, 7] << 8) | at[good, 8]
        step = (at[:, 0] == 0xFF) & walk[at[:, 1]] & ~sof & ~other_sof
        odd = ~sof & ~other_sof & ~step                 # not followed here: jpeg_scan decides
        by_scan(left[odd])
        pos[left[step]] += 2 + ((at[step, 2] << 8) | at[step, 3])
        left = left[step]
    by_scan(left)                                       # still walking after max_segments
    return out
