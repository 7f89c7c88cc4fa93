"""Decode one input file, normalise it to 8-bit RGB, resize, and encode it for a shard.

Runs in build worker processes, so it imports nothing heavy (no torch).
Odd inputs are normalised rather than rejected: EXIF rotation is applied,
CMYK/grayscale/palette become RGB, 16-bit is scaled to 8-bit, and alpha is
composited onto white. Only undecodable files (truncated, empty, not an
image) raise SampleError.

Resize policies (``size`` = S):
  fixed  short side to S, then the centred S x S crop (default; fixed shapes
         let readers view a batch as one array)
  short  short side to S, aspect kept (variable shapes)
  max    longer side to at most S, aspect kept, never upscaled
  none   stored at decoded size
"""
from __future__ import annotations

import io
import logging
import os
import stat
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from ..errors import FastdataError, SampleError

log = logging.getLogger("fastdata.build")
RESIZE_MODES = ("fixed", "short", "max", "none")
ENCODINGS = ("raw", "jpeg", "bytes")


@dataclass(frozen=True)
class CodecConfig:
    encode: str = "raw"      # raw | jpeg | bytes
    size: int = 256
    resize: str = "fixed"    # see module docstring
    quality: int = 90        # JPEG quality for encode=jpeg
    draft: bool = True       # let libjpeg decode at reduced scale when the target is much smaller


def check_codec(cfg: CodecConfig) -> None:
    """A one-line FastdataError, naming the build-cache/plan flag, for settings no image can be made with
    (a size of 0 reached PIL's resize as a traceback through `fastdata plan`)."""
    checks = [
        (cfg.encode in ENCODINGS, f"--encode {cfg.encode!r}: choose one of {', '.join(ENCODINGS)}"),
        (cfg.resize in RESIZE_MODES, f"--resize {cfg.resize!r}: choose one of {', '.join(RESIZE_MODES)}"),
        (isinstance(cfg.size, int) and 1 <= cfg.size <= 16384, f"--size {cfg.size}: give 1..16384 pixels"),
        (isinstance(cfg.quality, int) and 1 <= cfg.quality <= 100, f"--quality {cfg.quality}: give 1..100"),
    ]
    for ok, msg in checks:
        if not ok:
            raise FastdataError(msg)


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I"):
        arr = np.asarray(img, dtype=np.int64)
        top = int(arr.max(initial=0))
        peak = next(p for p in (255, 65535, top) if top <= p)      # 8-, 16-bit units, else the image's own top
        arr = np.clip(arr * 255 // peak, 0, 255).astype(np.uint8)
        return Image.fromarray(arr, "L").convert("RGB")
    if img.mode == "F":       # floats in [0, 1], else in 8- or 16-bit units (a float TIFF of 0..255 was all white)
        arr = np.nan_to_num(np.asarray(img, dtype=np.float32), nan=0.0, posinf=0.0, neginf=0.0)
        top = float(arr.max(initial=0.0))
        peak = next(p for p in (1.0, 255.0, 65535.0, top) if top <= p)
        return Image.fromarray(np.rint(np.clip(arr * (255.0 / peak), 0, 255)).astype(np.uint8), "L").convert("RGB")
    if img.mode == "P":
        img = img.convert("RGBA")
    if img.mode in ("RGBA", "LA", "PA", "La", "RGBa"):
        img = img.convert("RGBA")
        background = Image.new("RGBA", img.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, img).convert("RGB")
    return img if img.mode == "RGB" else img.convert("RGB")


def _target(w: int, h: int, cfg: CodecConfig) -> tuple[tuple[int, int], tuple[float, float, float, float]]:
    """Output (w, h) and source box for one resize call (crop and resize in one pass)."""
    s = cfg.size
    box = (0.0, 0.0, float(w), float(h))
    if cfg.resize == "fixed":
        m = min(w, h)
        box = ((w - m) / 2, (h - m) / 2, (w + m) / 2, (h + m) / 2)
        return (s, s), box
    if cfg.resize == "short":
        k = s / min(w, h)
    elif cfg.resize == "max":
        k = min(1.0, s / max(w, h))
    else:
        k = 1.0
    return (max(1, round(w * k)), max(1, round(h * k))), box


# what one cached image may hold: PIL's decompression-bomb threshold (89.5 megapixels), or more at large
# sizes, where a --resize short output may be MAX_ASPECT x SIZE x SIZE (a 4:1 panorama at the largest size)
MAX_OUTPUT_PIXELS = 89_478_485
MAX_ASPECT = 4


def oversized(w: int, h: int, cfg: CodecConfig) -> str | None:
    """Why a w x h image cannot be cached at cfg, else None: --resize short scales a 1 x 20,000 strip to
    256 x 5,120,000 (3.9 GB raw), and a build of it took 14 GB of memory and 72 s. The limit is the larger
    of MAX_OUTPUT_PIXELS and MAX_ASPECT x size x size, so only an image narrower than MAX_ASPECT:1 can pass
    it, and ordinary photos build at every size; --resize none keeps PIL's own limit on the input."""
    (ow, oh), _ = _target(w, h, cfg)
    if cfg.resize == "none" or ow * oh <= max(MAX_OUTPUT_PIXELS, MAX_ASPECT * cfg.size * cfg.size):
        return None
    return (f"{w}x{h} px would be resized to {ow}x{oh} ({ow * oh / 1e6:,.0f} megapixels) by --resize "
            f"{cfg.resize} --size {cfg.size}; use --resize fixed or max for images this narrow, or leave it out")


def open_rgb(data: bytes, draft: int | None = None) -> Image.Image:
    """bytes -> upright 8-bit RGB PIL image (EXIF rotation, 16-bit, CMYK, alpha, palette normalised).
    The one decode path of the build and of the PIL read backend. draft=S lets libjpeg decode a
    JPEG at a reduced scale that still covers S x S. Raises SampleError with the reason."""
    if not data:
        raise SampleError("empty file (0 bytes)")
    try:
        img = _open(data, draft)
        if draft and img.format == "JPEG":
            img.draft("RGB", (draft, draft))
        img = ImageOps.exif_transpose(img)
        img.load()
        return _to_rgb(img)
    except UnidentifiedImageError:
        raise SampleError("not an image PIL can read") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, EOFError) as e:
        raise SampleError(f"cannot decode: {e}") from None


def _open(data: bytes, draft: int | None) -> Image.Image:
    """Image.open, except that a JPEG over PIL's decompression-bomb limit is still opened where libjpeg's
    reduced-scale decode (draft) brings it under the limit: a 200-megapixel phone photo decodes at 1/8
    scale in a few MB, where PIL refused it before reading a pixel (and the build quarantined it)."""
    try:
        return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        if not draft or data[:2] != b"\xff\xd8":
            raise
        from PIL import JpegImagePlugin

        img = JpegImagePlugin.JpegImageFile(io.BytesIO(data))   # the plugin itself does not check the size
        full = img.size
        img.draft("RGB", (draft, draft))
        if img.width * img.height > 2 * (Image.MAX_IMAGE_PIXELS or 0):
            raise
        log.debug("%dx%d JPEG over PIL's pixel limit decoded at %dx%d", *full, *img.size)
        return img


def decode(data: bytes, cfg: CodecConfig) -> Image.Image:
    """bytes -> resized RGB PIL image. Raises SampleError with the reason."""
    img = open_rgb(data, cfg.size if cfg.draft and cfg.resize != "none" else None)
    why = oversized(img.width, img.height, cfg)
    if why:
        raise SampleError(why)
    size, box = _target(img.width, img.height, cfg)
    if size != img.size or box != (0, 0, img.width, img.height):
        img = img.resize(size, Image.BILINEAR, box=box)
    return img


def encode(data: bytes, cfg: CodecConfig) -> tuple[bytes, tuple[int, int, int]]:
    """One input file's bytes -> (payload, decoded HWC shape)."""
    if cfg.encode == "bytes":
        return data, (0, 0, 0)
    img = decode(data, cfg)
    shape = (img.height, img.width, 3)
    if cfg.encode == "raw":
        return img.tobytes(), shape
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=cfg.quality)
    return buf.getvalue(), shape


def dangling(path: str) -> str:
    """The quarantine reason of a symlink whose target is gone (discovery marks it: sources.py)."""
    return f"dangling symlink: its target {os.readlink(path)} does not exist"


def read_file(path: str, span: tuple[int, int] | None = None) -> bytes | str:
    """An input file's bytes, or the reason it is quarantined. span: (offset, size) of the input
    inside path (a tar member), read with one pread."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):   # before open: a pipe blocks there, a device never ends
            return "not a regular file (a device, pipe or socket): not read"
        with open(path, "rb") as f:
            return f.read() if span is None else os.pread(f.fileno(), span[1], span[0])
    except OSError as e:
        if os.path.islink(path) and not os.path.exists(path):
            return dangling(path)
        return f"cannot read: {e.strerror or e}"


def process_file(path: str, cfg: CodecConfig, span: tuple[int, int] | None = None
                 ) -> tuple[bytes, tuple[int, int, int], int] | str:
    """Worker entry: returns (payload, shape, crc32) or a reason string for quarantine."""
    data = read_file(path, span)
    return data if isinstance(data, str) else process_bytes(data, cfg)


def process_bytes(data: bytes, cfg: CodecConfig) -> tuple[bytes, tuple[int, int, int], int] | str:
    """One input's bytes -> (payload, shape, crc32), or the reason it is quarantined."""
    try:
        payload, shape = encode(data, cfg)
        return payload, shape, zlib.crc32(payload)
    except SampleError as e:
        return str(e)


def decode_jpeg_rgb(payload: bytes | memoryview | np.ndarray) -> np.ndarray:
    """Decode a JPEG payload from a kind=jpeg cache to uint8 HWC (reader side, CPU)."""
    img = Image.open(io.BytesIO(bytes(payload)))
    return np.asarray(img.convert("RGB"))
