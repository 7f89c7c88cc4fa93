"""What closing a shard costs (writers.ShardWriter.close: write the file, fsync, rename, hash), and
whether hashing while the fsync waits on the disk shortens it.

    python benchmarks/shard_close.py [--shard-mb 256] [--rounds 6] [--dir /tmp]

Why: a GPU build process works through its shard serially, and closing a 256 MB shard (about 1,300
images of 256 px raw) costs it write + fsync + a read-back hash; during the fsync its core is idle.
Rows alternate over --rounds on the same payloads; each round writes fresh files into --dir (which
should be on the disk the cache goes to) and deletes them. The table keeps each row's median.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import write

from fastdata import _util
from fastdata.cache.writers import H5ShardWriter

ITEM = 256 * 256 * 3


def _fill(writer, payloads) -> None:
    for i, p in enumerate(payloads):
        writer.add(p, i % 10, (256, 256, 3), 0, f"k{i}")


def _serial_close(writer):
    """The close before: fsync, rename, then the hash read back."""
    writer._write(writer._buf.samples, writer._buf.arrays())
    _util.atomic_replace(writer.tmp, writer.path)
    return _util.file_sha256(writer.path)


def _one(folder: Path, payloads, overlapped: bool) -> dict:
    w = H5ShardWriter(folder / "shard-00000.h5")
    _fill(w, payloads)
    t0 = time.perf_counter()
    sha = w.close().sha256 if overlapped else _serial_close(w)
    took = time.perf_counter() - t0
    (folder / "shard-00000.h5").unlink()
    return {"s": took, "sha": sha}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shard-mb", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n = (args.shard_mb << 20) // ITEM
    payloads = [rng.integers(0, 255, ITEM, dtype=np.uint8).tobytes() for _ in range(n)]
    folder = Path(tempfile.mkdtemp(prefix="fastdata-close-", dir=args.dir))
    times: dict[str, list[float]] = {"serial": [], "hash during fsync": []}
    try:
        _one(folder, payloads, True)           # warm-up: the page cache's pages, h5py's import
        for _ in range(args.rounds):
            a, b = _one(folder, payloads, False), _one(folder, payloads, True)
            if a["sha"] != b["sha"]:
                raise SystemExit("the two closes wrote different files")
            times["serial"].append(a["s"])
            times["hash during fsync"].append(b["s"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    base = statistics.median(times["serial"])
    rows = [{"close": k, "s per shard": f"{statistics.median(v):.3f}", "ms per image": f"{1e3 * statistics.median(v) / n:.3f}",
             "x serial": f"{statistics.median(v) / base:.2f}", "rounds": " ".join(f"{x:.3f}" for x in v)}
            for k, v in times.items()]
    write("shard-close", rows, ["close", "s per shard", "ms per image", "x serial", "rounds"],
          notes=f"{n} images of 256x256x3 raw ({args.shard_mb} MB) into one h5 shard in {folder.parent}; rows alternate; "
                f"median of {args.rounds} rounds. Rerun: `python benchmarks/shard_close.py --shard-mb {args.shard_mb} "
                f"--rounds {args.rounds}`")


if __name__ == "__main__":
    main()
