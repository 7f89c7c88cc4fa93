"""The nvjpeg loader alone (no model) on a JPEG cache: img/s by decoder, lanes and nvJPEG backend.

    python benchmarks/decode_lanes.py --jpeg JPEG_CACHE [--seconds 4] [--out DIR]

Why: on an H100 the loader's GPU thread took ~17 ms per 256-image batch with either decoder
(torchvision's decode_jpeg or our call of the NVJPG engines), which capped it below resnet18's
rate. If that time is nvJPEG's host-side work per image (parsing, setup) rather than the engines,
GPU threads side by side ("lanes", each with its own nvJPEG handle) multiply the rate; if it is the
engines, they do not. The "ours, hybrid" rows put our binding on nvJPEG's other backends (CPU
Huffman with GPU IDCT), where lanes would spread the Huffman work over cores.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from _common import drain, write

# nvjpegBackend_t values (nvjpeg.h): which backend our binding (fastdata/cache/hw_decode.py) creates
BACKENDS = {"hardware": 3, "default": 0, "hybrid": 1, "gpu_hybrid": 2}


def rows_wanted() -> list[tuple[str, dict, str]]:
    """(name, loader options, nvJPEG backend of our binding)."""
    out = [("torchvision decode_jpeg, 1 lane", dict(hardware=False), "hardware"),
           ("torchvision decode_jpeg, 2 lanes", dict(hardware=False, lanes=2), "hardware")]
    for lanes in (1, 2, 4):
        out.append((f"ours, engines, {lanes} lane(s)", dict(hardware=True, lanes=lanes), "hardware"))
    for backend in ("default", "hybrid", "gpu_hybrid"):
        for lanes in (1, 4):
            out.append((f"ours, {backend} backend, {lanes} lane(s)", dict(hardware=True, lanes=lanes), backend))
    for share, threads in ((0.3, 8), (0.5, 8), (0.5, 14), (1.0, 14)):   # the CPU's share (cpu_share.py)
        out.append((f"ours, engines, cpu share {share}, {threads} threads",
                    dict(hardware=True, cpu_share=share, threads=threads), "hardware"))
    return out


def measure(jpeg: Path, bs: int, seconds: float, options: dict, backend: str) -> dict:
    import fastdata
    from fastdata.cache import hw_decode
    from fastdata.read.augment import AugmentConfig

    old, hw_decode._BACKEND_HARDWARE = hw_decode._BACKEND_HARDWARE, BACKENDS[backend]
    try:
        dl = fastdata.loader(jpeg, bs, device="cuda", backend="nvjpeg", drop_last=True,
                             augment=AugmentConfig(size=224, dtype="bfloat16"), **{"threads": 8, **options})
        try:
            rate = drain(dl, seconds)
            return {"img/s": rate, "decoder": dl.backend.hardware, **dl.backend.decoded}
        finally:
            dl.close()
    except Exception as e:  # noqa: BLE001 - a backend nvJPEG refuses is a row, not the end of the run
        return {"img/s": 0.0, "decoder": f"failed: {str(e).splitlines()[0][:120]}"}
    finally:
        hw_decode._BACKEND_HARDWARE = old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jpeg", required=True)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--only", default="", help="comma list of substrings of the rows to run")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    rows = []
    for name, options, backend in rows_wanted():
        if a.only and not any(k in name for k in a.only.split(",")):
            continue
        r = {"variant": name, **measure(Path(a.jpeg), a.batch_size, a.seconds, options, backend)}
        print(r, flush=True)
        rows.append(r)
    write("decode-lanes", rows, ["variant", "img/s", "decoder", "hardware", "torchvision", "cpu"],
          f"The nvjpeg loader alone on {a.jpeg}, batch {a.batch_size}, 224 px bf16 crops, 8 reader threads "
          f"unless the row says, "
          f"{a.seconds:.0f} s per row. Rerun: `python benchmarks/decode_lanes.py --jpeg JPEG_CACHE`.",
          Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
