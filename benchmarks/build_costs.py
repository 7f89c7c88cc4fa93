"""Where a CPU build's time goes, per image, single thread: the parts of the codec timed apart, and
torch's uint8 antialiased resize as a candidate for the largest part.

    python benchmarks/build_costs.py [--images 300] [--size 256] [--rounds 3]

Why: a build on the 2-core box costs ~2.5 ms of CPU an image against ~1.8 ms for plain PIL
(decode, resize, crop), and issue #21 asks for 1.5x the plain rate. A cProfile of a one-process
build (2026-12-05) put 1.0 ms in PIL's resize, 0.63 ms in decode and 0.4 ms in writing the h5
dataset. This measures the parts without the profiler's overhead, and whether torch's AVX2 uint8
path (F.interpolate, bilinear, antialias=True, channels_last) would shrink the resize. It decodes
nothing twice: every row works on the same decoded images. Rows alternate over --rounds; the
table keeps each row's median.
"""
from __future__ import annotations

import argparse
import io
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from _common import write


def _codec_resize(im, size: int):
    """The codec's own resize step (codecs.decode after open_rgb): its box, PIL's bilinear."""
    from PIL import Image

    from fastdata.cache.codecs import CodecConfig, _target

    out, box = _target(im.width, im.height, CodecConfig(size=size))
    return im.resize(out, Image.BILINEAR, box=box)


def _whole_pixel_square(h: int, w: int) -> tuple[int, int, int]:
    """(top, left, side) of the centred square cut at whole pixels: interpolate takes no source box."""
    m = min(h, w)
    return (h - m) // 2, (w - m) // 2, m


def _pil_whole_pixel(im, size: int):
    from PIL import Image

    top, left, m = _whole_pixel_square(im.height, im.width)
    return im.crop((left, top, left + m, top + m)).resize((size, size), Image.BILINEAR)


def _torch_aa(a: np.ndarray, size: int) -> torch.Tensor:
    top, left, m = _whole_pixel_square(a.shape[0], a.shape[1])
    x = torch.from_numpy(a[top:top + m, left:left + m]).permute(2, 0, 1)[None]
    x = x.contiguous(memory_format=torch.channels_last)
    return torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", antialias=True)


def _levels(pil_image, tensor: torch.Tensor) -> np.ndarray:
    """|PIL - torch| per value, in 0..255 levels."""
    return np.abs(np.asarray(pil_image, np.int16) - tensor[0].permute(1, 2, 0).numpy().astype(np.int16))


def _time(fn, items) -> float:
    t0 = time.perf_counter()
    for x in items:
        fn(x)
    return (time.perf_counter() - t0) / len(items) * 1e6


def main() -> None:
    from PIL import Image

    from fastdata.cache.codecs import open_rgb
    from fastdata.sample import make_image_folder

    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=300)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="fastdata-costs-"))
    try:
        src = make_image_folder(tmp / "src", max(1, a.images // 10))
        data = [p.read_bytes() for p in sorted(src.rglob("*.jpg"))][:a.images]
        decoded = [open_rgb(d) for d in data]
        arrays = [np.ascontiguousarray(np.asarray(im)) for im in decoded]
        rows = {
            "PIL decode (open_rgb)": (open_rgb, data),
            "PIL resize, centre box (the codec's)": (lambda im: _codec_resize(im, a.size), decoded),
            "torch uint8 antialiased resize, integer crop": (lambda x: _torch_aa(x, a.size), arrays),
            "tobytes": (lambda im: im.tobytes(), [_codec_resize(im, a.size) for im in decoded]),
        }
        times = {k: [] for k in rows}
        for _ in range(a.rounds):
            for name, (fn, items) in rows.items():
                times[name].append(_time(fn, items))
        diffs = [_levels(_codec_resize(im, a.size), _torch_aa(x, a.size)).mean() for im, x in zip(decoded, arrays)]
        same = np.concatenate([_levels(_pil_whole_pixel(im, a.size), _torch_aa(x, a.size)).ravel()
                               for im, x in zip(decoded, arrays)])
        table = [{"part": k, "µs per image": float(np.median(v))} for k, v in times.items()]
        w, h = Image.open(io.BytesIO(data[0])).size
        notes = (f"{len(data)} JPEGs of {w}x{h} (q90) from skimage/sklearn photos, size {a.size}, one thread, "
                 f"median of {a.rounds} alternating rounds. torch against PIL pixels: mean absolute difference "
                 f"{np.mean(diffs):.2f} levels (torch crops at whole pixels where the codec's box is "
                 f"half-pixel centred); against PIL on the same whole-pixel crop (the kernels alone) {same.mean():.4f}, "
                 f"worst {same.max()} level(s), {np.mean(same > 0):.3%} of values differ.\n\n"
                 f"Rerun: `python benchmarks/build_costs.py --images {a.images} --size {a.size} --rounds {a.rounds}`")
        write("build-costs", table, ["part", "µs per image"], notes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
