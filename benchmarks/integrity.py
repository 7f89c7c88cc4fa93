"""What the loader's integrity modes cost (fastdata/read/integrity.py): img/s with off / shard / sample.

    python benchmarks/integrity.py [--per-class 100] [--size 224] [--seconds 5] [--work DIR]

All rows read the same raw cache, in one run, each with a fresh loader (so the shard mode pays its
background hashing inside the timed window). Also reported: how long the shard mode takes to have
hashed every shard, and the single-core crc32 / sha256 rates of this machine.
"""
from __future__ import annotations

import hashlib
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from _common import data_args, drain, write


def _data(work: Path, per_class: int, size: int) -> Path:
    from fastdata.cache.build import BuildConfig, build_cache
    from fastdata.sample import make_image_folder

    src, raw = work / "src", work / f"raw{size}"
    if not src.exists():
        make_image_folder(src, per_class=per_class)
    build_cache(BuildConfig(src=str(src), dest=str(raw), size=size, progress=False))
    return raw


def _rates(size: int) -> dict:
    rows = np.random.default_rng(0).integers(0, 255, (256, size * size * 3), dtype=np.uint8)
    t0 = time.perf_counter()
    for r in rows:
        zlib.crc32(r)
    crc = rows.nbytes / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    hashlib.sha256(rows).digest()
    sha = rows.nbytes / (time.perf_counter() - t0)
    return {"crc32 GB/s (1 core)": crc / 1e9, "crc32 img/s (1 core)": crc / rows[0].nbytes,
            "sha256 GB/s (1 core)": sha / 1e9}


def main() -> None:
    import torch

    import fastdata

    ap = data_args()
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="fastdata-integrity-"))
    raw = _data(work, a.per_class, a.size)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for mode in ("off", "shard", "sample"):
        dl = fastdata.loader(raw, a.batch_size, device=device, integrity=mode)
        t0 = time.perf_counter()
        rate = drain(dl, a.seconds)
        row = {"mode": mode, "img/s": rate}
        if mode == "shard":
            dl.backend.cache._hasher.join()
            row["all shards hashed after s"] = time.perf_counter() - t0
        rows.append(row)
    for r in rows:
        r["x off"] = r["img/s"] / rows[0]["img/s"]
    rates = _rates(a.size)
    notes = (f"Cache: {raw} ({a.per_class * 10} images, {a.size} px raw), batch {a.batch_size}, device {device}.\n"
             + "\n".join(f"- {k}: {v:,.2f}" for k, v in rates.items())
             + "\n\nRerun: `python benchmarks/integrity.py "
             f"--per-class {a.per_class} --size {a.size} --seconds {a.seconds}`")
    write("integrity", rows, ["mode", "img/s", "x off", "all shards hashed after s"], notes)


if __name__ == "__main__":
    main()
