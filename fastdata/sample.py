"""Generate sample data sets from real photos shipped with scikit-image / scikit-learn.

Nothing is downloaded: the photos are files inside those packages. Each class
is one base photo; samples are random crops, flips, scales and brightness
shifts of it, saved as JPEG, so the data is photo-like (real JPEG entropy and
decode cost) and the classes are learnable. On machines without those
packages, pass ``photos_dir`` holding images exported by ``export_photos``.
"""
from __future__ import annotations

import io
import os
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from ._util import usable_cpus
from .errors import DependencyError

_SKIMAGE = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "hubble_deep_field.jpg", "retina.jpg",
            "motorcycle_left.png", "camera.png")


def base_photos(photos_dir: str | Path | None = None) -> dict[str, np.ndarray]:
    """name -> uint8 HWC RGB photo, from photos_dir or skimage/sklearn."""
    photos_dir = photos_dir or os.environ.get("FASTDATA_PHOTOS")
    if photos_dir is not None:
        files = sorted(p for p in Path(photos_dir).iterdir() if p.suffix.lower() in (".png", ".jpg"))
        return {p.stem: np.asarray(Image.open(p).convert("RGB")) for p in files}
    try:
        import skimage
    except ImportError:
        raise DependencyError("sample data needs scikit-image: pip install 'fastdata[dev]' "
                              "(or pass photos_dir=...)") from None
    out = {}
    folder = Path(skimage.__file__).parent / "data"  # files inside the wheel: never a download
    for fname in _SKIMAGE:
        out[Path(fname).stem] = np.asarray(Image.open(folder / fname).convert("RGB"))
    try:
        from sklearn.datasets import load_sample_images

        imgs = load_sample_images()
        for fname, img in zip(imgs.filenames, imgs.images):
            out[Path(fname).stem] = img
    except ImportError:
        pass
    return out


def export_photos(dest: str | Path) -> list[Path]:
    """Write the base photos as PNG files (to carry them to a machine without skimage)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, img in base_photos().items():
        paths.append(dest / f"{name}.png")
        Image.fromarray(img).save(paths[-1])
    return paths


def _variant(photo: np.ndarray, rng: np.random.Generator, out_wh: tuple[int, int]) -> Image.Image:
    h, w = photo.shape[:2]
    scale = rng.uniform(0.35, 1.0)
    cw, ch = max(16, int(w * scale)), max(16, int(h * scale))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    img = Image.fromarray(photo[y:y + ch, x:x + cw])
    ow, oh = out_wh if rng.random() < 0.75 else out_wh[::-1]
    img = img.resize((ow, oh), Image.BILINEAR)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return img.point(_gain_table(rng.uniform(0.75, 1.25)))


def _gain_table(gain: float) -> list[int]:
    return [min(255, int(v * gain)) for v in range(256)] * 3


def _make_class(args) -> int:
    name, photo, dest, lo, hi, seed, out_wh, quality = args
    rng = np.random.default_rng([seed, zlib.crc32(name.encode()), lo])
    folder = Path(dest) / name
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(lo, hi):
        buf = io.BytesIO()
        _variant(photo, rng, out_wh).save(buf, format="JPEG", quality=quality)
        (folder / f"{name}_{i:06d}.jpg").write_bytes(buf.getvalue())
    return hi - lo


def make_image_folder(dest: str | Path, per_class: int = 32, *, classes: int | None = None, seed: int = 0,
                      size: tuple[int, int] = (500, 375), quality: int = 90, photos_dir=None,
                      workers: int | None = None) -> Path:
    """An ImageFolder tree dest/<class>/<file>.jpg of per_class JPEGs per base photo."""
    photos = sorted(base_photos(photos_dir).items())[:classes]
    step = 256  # images per job, so that many cores share even a few classes
    jobs = [(name, photo, str(dest), lo, min(per_class, lo + step), seed, size, quality)
            for name, photo in photos for lo in range(0, per_class, step)]
    workers = min(len(jobs), workers or usable_cpus())
    if workers <= 1:
        list(map(_make_class, jobs))
    else:
        with ProcessPoolExecutor(workers) as ex:
            list(ex.map(_make_class, jobs))
    return Path(dest)


def make_corrupt_zoo(dest: str | Path, good: np.ndarray) -> dict[str, str]:
    """Odd and broken inputs in dest/zoo/. Returns file -> 'ok' (must decode) or 'bad' (must quarantine)."""
    folder = Path(dest) / "zoo"
    folder.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(good)
    jpeg = io.BytesIO()
    img.save(jpeg, format="JPEG", quality=90)
    jb = jpeg.getvalue()
    expect = {}

    def put(name, data, verdict):
        (folder / name).write_bytes(data)
        expect[f"zoo/{name}"] = verdict

    def save(name, im, fmt, verdict="ok", **kw):
        b = io.BytesIO()
        im.save(b, format=fmt, **kw)
        put(name, b.getvalue(), verdict)

    put("truncated.jpg", jb[: len(jb) // 3], "bad")
    put("zero.jpg", b"", "bad")
    put("text.jpg", b"this is not an image\n" * 20, "bad")
    put("random.png", np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes(), "bad")
    put("header_only.png", b"\x89PNG\r\n\x1a\n" + b"\0" * 64, "bad")
    save("cmyk.jpg", img.convert("CMYK"), "JPEG")
    save("gray.png", img.convert("L"), "PNG")
    save("gray16.png", Image.fromarray((np.asarray(img.convert("L"), dtype=np.uint16) * 257)), "PNG")
    save("alpha.png", img.convert("RGBA"), "PNG")
    save("palette.gif", img.convert("P"), "GIF")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW on display
    save("exif_rotated.jpg", img, "JPEG", exif=exif.tobytes())
    save("tiny.png", img.resize((1, 1)), "PNG")
    save("bmp.bmp", img, "BMP")
    png = io.BytesIO()
    img.save(png, format="PNG")
    pb = png.getvalue()
    put("truncated.png", pb[: len(pb) // 2], "bad")
    bad_crc = bytearray(pb)
    bad_crc[40] ^= 0xFF  # inside the first IDAT chunk
    put("bad_crc.png", bytes(bad_crc), "bad")
    put("soi_only.jpg", b"\xff\xd8", "bad")
    put("zip.jpg", b"PK\x03\x04" + b"\0" * 100, "bad")
    put("html.png", b"<html><body>404 not found</body></html>", "bad")
    bomb = io.BytesIO()
    Image.new("1", (20000, 20000)).save(bomb, format="PNG")  # 400 Mpx: over PIL's bomb limit
    put("bomb.png", bomb.getvalue(), "bad")
    return expect
