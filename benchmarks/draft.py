"""JPEG decode at reduced scale (libjpeg DCT scaling through PIL's Image.draft) against full decode + resize.

    python benchmarks/draft.py [--per-class 20] [--sizes 64,128,224,256] [--src DIR]

Same files, same codec (fastdata/cache/codecs.py), draft on and off: decode+resize img/s on one core,
and the pixel difference of the draft result from the full-decode result (mean and 99.9th percentile
absolute difference in 8-bit levels, PSNR). The build uses draft by default because the difference
stays within the tolerance that tests/test_draft.py states and holds it to.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import write


def compare(files: list[Path], size: int) -> dict:
    from fastdata.cache.codecs import CodecConfig, decode

    datas = [p.read_bytes() for p in files]
    out = {}
    for draft in (False, True):
        cfg = CodecConfig(size=size, draft=draft)
        decode(datas[0], cfg)
        t0 = time.perf_counter()
        imgs = [np.asarray(decode(d, cfg), dtype=np.int16) for d in datas]
        out[draft] = (imgs, len(datas) / (time.perf_counter() - t0))
    diff = np.concatenate([np.abs(a - b).ravel() for a, b in zip(out[False][0], out[True][0])])
    mse = float(np.mean(diff.astype(np.float64) ** 2))
    return {"size": size, "full img/s": out[False][1], "draft img/s": out[True][1],
            "speed-up": out[True][1] / out[False][1], "mean |diff|": float(diff.mean()),
            "p99.9 |diff|": float(np.percentile(diff, 99.9)),
            "PSNR dB": 10 * np.log10(255 ** 2 / mse) if mse else float("inf")}


def main() -> None:
    from fastdata.sample import make_image_folder

    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=20)
    ap.add_argument("--sizes", default="64,128,224,256")
    ap.add_argument("--src", default=None, help="a folder of JPEGs (default: generated ~500x375 photos)")
    a = ap.parse_args()
    src = Path(a.src) if a.src else make_image_folder(Path(tempfile.mkdtemp()) / "src", a.per_class)
    files = sorted(src.rglob("*.jpg"))
    rows = [compare(files, int(s)) for s in a.sizes.split(",")]
    notes = (f"{len(files)} JPEGs from {src} (generated: ~500x375 q90 photo variants). One core, page cache warm."
             f"\n\nRerun: `python benchmarks/draft.py --per-class {a.per_class} --sizes {a.sizes}`")
    write("draft", rows, ["size", "full img/s", "draft img/s", "speed-up", "mean |diff|", "p99.9 |diff|", "PSNR dB"],
          notes)


if __name__ == "__main__":
    main()
