"""What feeding one batch of JPEG bytes to DALI costs the calling (training) thread.

The DALI backend feeds a JPEG cache's bytes through fn.external_source, in the training thread (inside
pipe.run()). Beside resnet18 on an H100 host that thread spent 12 ms of CPU a step with DALI against
7.8 ms with the nvjpeg backend (host-probe-resnet18-jpeg-H100-80GB-HBM3-2026-12-07-s9-dali.md). This
times feed_input alone, for a batch given as a list of per-sample arrays (as the backend feeds it) and
as one padded dense array, and as one TensorListCPU built beforehand (the Feeder's reader thread can build
it: "build ms" is what that costs there), on a CPU pipeline that only takes the shapes, so decoding costs
nothing.

    python benchmarks/dali_feed.py [--batch-size 256] [--iters 200]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from _common import write


def _pipe(bs: int):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=bs, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def shapes():
        return fn.external_source(name="src", dtype=types.UINT8, ndim=1).shape()
    pipe = shapes()
    pipe.build()
    return pipe


def time_feed(data, bs: int, iters: int) -> dict:
    pipe = _pipe(bs)
    for _ in range(5):
        pipe.feed_input("src", data)
        pipe.run()
    fed, t = 0.0, time.perf_counter()
    for _ in range(iters):
        t0 = time.perf_counter()
        pipe.feed_input("src", data)
        fed += time.perf_counter() - t0
        pipe.run()
    return {"feed ms": 1e3 * fed / iters, "feed + run ms": 1e3 * (time.perf_counter() - t) / iters}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.batch_size < 1 or a.iters < 1:
        ap.error(f"--batch-size {a.batch_size} --iters {a.iters}: give 1 or more for both")
    try:
        import nvidia.dali  # noqa: F401
    except ImportError:
        print("dali_feed: NVIDIA DALI is not installed; pip install 'fastdata[dali]'")
        return 2
    rng = np.random.default_rng(0)
    lens = rng.integers(12_000, 22_000, a.batch_size)     # cache-sized JPEGs (256 px, q90: ~16 KB)
    samples = [rng.integers(0, 255, n, dtype=np.uint8) for n in lens]
    dense = np.zeros((a.batch_size, lens.max()), np.uint8)
    from nvidia.dali.tensors import TensorListCPU

    t0 = time.perf_counter()
    for _ in range(a.iters):
        built = TensorListCPU(samples)
    build_ms = 1e3 * (time.perf_counter() - t0) / a.iters
    rows = []
    for rnd in range(2):                                   # alternating, twice
        for name, data, cost in ((f"list of {a.batch_size} arrays", samples, 0.0),
                                 ("one padded dense array", dense, 0.0),
                                 ("one TensorListCPU of the arrays, built beforehand", built, build_ms)):
            rows.append({"variant": name, "round": rnd, "build ms": cost, **time_feed(data, a.batch_size, a.iters)})
    write("dali-feed", rows, ["variant", "round", "build ms", "feed ms", "feed + run ms"],
          f"feed_input of one batch of {a.batch_size} random byte strings of 12-22 KB into a DALI CPU pipeline "
          f"that only takes their shapes; {a.iters} batches a row. Rerun: `python benchmarks/dali_feed.py`.",
          None if a.out is None else __import__("pathlib").Path(a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
