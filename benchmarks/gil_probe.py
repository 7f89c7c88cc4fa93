"""How much a loader slows the training thread: the trade between read="mmap" and read="pread".

    python benchmarks/gil_probe.py [--cache DIR] [--seconds 4] [--reps 3]

The main thread runs tiny torch ops in a loop, standing in for an eager training step that launches
hundreds of small kernels; fastdata.loader drains a raw cache in the background. Reported: the main
thread's ops/s (alone and beside each read mode) and the loader's img/s. On the H200 an eager bf16
ResNet-50 trained at 2,378 img/s from a raw cache with read="pread" against 4,658 on synthetic data
while data wait was only 3%: the readers were slowing the launching thread, which this measures.
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import torch

from _common import tiny_ops, write


def probe(cache: Path, read: str, seconds: float) -> tuple[float, float]:
    import fastdata

    dl = fastdata.loader(cache, 256, device="cpu", threads=2, read=read)
    stop, count = threading.Event(), [0]

    def drain():
        while not stop.is_set():
            for b in dl:
                count[0] += len(b[1])
                if stop.is_set():
                    break
    t = threading.Thread(target=drain)
    t0 = time.perf_counter()
    t.start()
    ops = tiny_ops(seconds)
    stop.set()
    t.join()
    return ops, count[0] / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", default=None)
    ap.add_argument("--seconds", type=float, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--photos", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    cache = Path(a.cache) if a.cache else None
    if cache is None:
        from fastdata.cache.build import BuildConfig, build_cache
        from fastdata.sample import make_image_folder

        tmp = Path(tempfile.mkdtemp())
        src = make_image_folder(tmp / "src", 100, photos_dir=a.photos)
        cache = tmp / "raw"
        build_cache(BuildConfig(src=str(src), dest=str(cache), progress=False))
    rows = [{"case": "main thread alone", "main ops/s": tiny_ops(a.seconds), "loader img/s": ""}]
    for read in ("pread", "mmap"):
        runs = [probe(cache, read, a.seconds) for _ in range(a.reps)]
        rows.append({"case": f"beside loader read={read} (median of {a.reps})",
                     "main ops/s": sorted(r[0] for r in runs)[a.reps // 2],
                     "loader img/s": sorted(r[1] for r in runs)[a.reps // 2]})
    write("gil-probe", rows, ["case", "main ops/s", "loader img/s"],
          "Higher main ops/s = the loader leaves the training thread more room.", Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
