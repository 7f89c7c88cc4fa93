"""Loader throughput on the same data: plain PIL DataLoader, fastdata.dataloader, fastdata.loader.

    python benchmarks/loader.py [--per-class 100] [--seconds 6] [--photos DIR] [--out DIR]

Each row runs in its own process so its peak memory is its own. On a GPU
machine batches are delivered to the GPU (and augmented there for fastdata
rows); on CPU they are delivered to host memory. Goals (issue 3): >= 15x the
PIL DataLoader from a raw cache on the 2-core CPU box; >= 40,000 img/s of
224 px batches to the GPU on the 16-core GPU machine.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import drain, flat_out, peak_rss_mb, write

ROWS = ["pil-dataloader", "pil-dataloader-autotuned", "dataloader-cachedataset", "loader-raw-uint8",
        "loader-raw-gpu-augment", "loader-jpeg", "gather-ceiling"]
# GPU machine only: where the time goes (reading alone, the copy alone, the other reader, more threads)
GPU_ROWS = ["loader-raw-uint8-host", "loader-raw-uint8-pread", "loader-raw-uint8-16threads", "h2d-copy-ceiling"]


def _make(row: str, src: Path, raw: Path, jpeg: Path, bs: int, device):
    import fastdata
    from _datasets import PilFolder
    from fastdata._util import usable_cpus
    from fastdata.read.augment import AugmentConfig

    cuda = device.type == "cuda"
    aug = AugmentConfig(size=224, dtype="bfloat16") if cuda else None
    if row == "pil-dataloader":
        from torch.utils.data import DataLoader

        return DataLoader(PilFolder(src), bs, shuffle=True, num_workers=min(4, usable_cpus()), pin_memory=cuda)
    if row == "pil-dataloader-autotuned":
        return fastdata.dataloader(PilFolder(src), bs, autotune_seconds=1.5)
    if row == "dataloader-cachedataset":
        return fastdata.dataloader(fastdata.CacheDataset(raw), bs)
    threads = min(8, usable_cpus() * 2)
    if row == "loader-raw-uint8":
        return fastdata.loader(raw, bs, device=str(device), threads=threads)
    if row == "loader-raw-uint8-host":
        return fastdata.loader(raw, bs, device="cpu", threads=threads)
    if row == "loader-raw-uint8-pread":
        return fastdata.loader(raw, bs, device=str(device), threads=threads, read="pread")
    if row == "loader-raw-uint8-16threads":
        return fastdata.loader(raw, bs, device=str(device), threads=16)
    if row == "loader-raw-gpu-augment":
        return fastdata.loader(raw, bs, device=str(device), augment=aug or AugmentConfig(size=224),
                               threads=min(8, usable_cpus() * 2))
    return fastdata.loader(jpeg, bs, device=str(device), augment=aug, threads=usable_cpus())


def h2d_ceiling(bs: int, seconds: float, shape=(224, 224, 3)) -> float:
    """img/s that pinned host-to-device copies alone reach (batches of bs uint8 images, two in flight):
    no loader can deliver more than this."""
    import torch

    src = [torch.randint(0, 255, (bs, *shape), dtype=torch.uint8).pin_memory() for _ in range(2)]
    dst = [torch.empty((bs, *shape), dtype=torch.uint8, device="cuda") for _ in range(2)]
    for s, d in zip(src, dst):
        d.copy_(s, non_blocking=True)
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for s, d in zip(src, dst):
            d.copy_(s, non_blocking=True)
            n += bs
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def gather_ceiling(raw: Path, bs: int, seconds: float, threads: int, pin: bool) -> float:
    """img/s that `threads` threads reach gathering random sorted batches from the raw cache into their
    own reused (pinned) slots with the loader's own fill_batch, and nothing else: no order, no ring,
    no copy. The reading ceiling of this machine; a loader row far below it loses time elsewhere."""

    import numpy as np
    import torch

    from fastdata.read.fill import fill_batch
    from fastdata.read.reader import open_cache

    cache = open_cache(raw)
    n, counts = len(cache), [0] * threads

    def work(k: int, stop) -> None:
        rng = np.random.default_rng(k)
        slot = {"images": torch.empty((bs, *cache.sample_shape), dtype=torch.uint8, pin_memory=pin),
                "labels": torch.empty(bs, dtype=torch.int64, pin_memory=pin)}
        while not stop.is_set():
            fill_batch(cache, np.sort(rng.choice(n, bs, replace=False)), slot)
            counts[k] += bs

    wall = flat_out(work, threads, seconds)      # (before the sum: the threads fill counts)
    return sum(counts) / wall


def run_one(row: str, a) -> dict:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if row == "h2d-copy-ceiling":
        return {"row": row, "img/s": h2d_ceiling(a.batch_size, a.seconds), "peak RSS MB": peak_rss_mb(),
                "device": device.type}
    if row == "gather-ceiling":
        from fastdata._util import usable_cpus

        rate = gather_ceiling(Path(a.raw), a.batch_size, a.seconds, usable_cpus(), device.type == "cuda")
        return {"row": row, "img/s": rate, "peak RSS MB": peak_rss_mb(), "device": "host"}
    dl = _make(row, Path(a.src), Path(a.raw), Path(a.jpeg), a.batch_size, device)
    rate = drain(dl, a.seconds, device)
    return {"row": row, "img/s": rate, "peak RSS MB": peak_rss_mb(), "device": device.type}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--photos", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--work", default=None, help="reuse this folder for data (src/, raw/, jpeg/)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--src"), ap.add_argument("--raw"), ap.add_argument("--jpeg")
    a = ap.parse_args()
    if a.one:
        print(json.dumps(run_one(a.one, a)))
        return
    import torch

    from fastdata.cache.build import BuildConfig, build_cache
    from fastdata.sample import make_image_folder

    work = Path(a.work or tempfile.mkdtemp(prefix="fastdata-loader-"))
    src, raw, jpeg = work / "src", work / "raw224", work / "jpeg256"
    if not src.exists():
        make_image_folder(src, a.per_class, photos_dir=a.photos)
    build_cache(BuildConfig(src=str(src), dest=str(raw), size=224, progress=False))
    build_cache(BuildConfig(src=str(src), dest=str(jpeg), encode="jpeg", size=256, progress=False))
    rows = []
    for row in ROWS + (GPU_ROWS if torch.cuda.is_available() else []):
        cmd = [sys.executable, __file__, "--one", row, "--src", str(src), "--raw", str(raw), "--jpeg", str(jpeg),
               "--seconds", str(a.seconds), "--batch-size", str(a.batch_size)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            rows.append({"row": row, "img/s": 0.0, "error": out.stderr.strip().splitlines()[-1][:120]})
            continue
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = rows[0]["img/s"] or 1.0
    for r in rows:
        r["x PIL"] = f"{r['img/s'] / base:.1f}x"
    n = sum(1 for _ in src.rglob("*.jpg"))
    notes = (f"{n} JPEGs (500x375 q90, from skimage/sklearn photos), batch {a.batch_size}, {a.seconds:.0f} s per "
             f"row. PIL rows decode+RandomResizedCrop(224)+flip+normalise in workers. loader-raw-* read a "
             f"224 px raw cache (uint8: as stored; gpu-augment: RandomResizedCrop+flip+normalise on the "
             f"device). loader-jpeg decodes a 256 px JPEG cache with PIL in threads. gather-ceiling: one thread per CPU "
             f"gathering random batches from the raw cache into reused slots, nothing else (this machine's "
             f"reading ceiling). GPU machine only: -host delivers "
             f"to host memory (reading alone), -pread reads with pread() instead of the memory map, "
             f"h2d-copy-ceiling copies pinned uint8 224 px batches to the GPU and nothing else.")
    write("loader", rows, ["row", "img/s", "x PIL", "peak RSS MB", "device", "error"], notes,
          Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
