"""What the CPU share's decode processes cost the loader's own process, per batch.

    python benchmarks/pool_overhead.py [--processes 12] [--readers 8] [--batch 256] [--seconds 6]

The decode processes take no GIL from the training process, but finding a batch's bytes and handing
them work does, in the
loader's own process, beside a launch-bound training thread (resnet18 on an H100). `readers` threads
hand batches to a DecodePool flat out, as the nvjpeg backend's reader threads do, cut into each of
--tasks tasks in turn; the table gives the loader process's CPU seconds (process_time: the decode
processes are not in it) per batch, the images decoded a second, and each decode() call's wall time
(a read's latency: the fewer the tasks, the longer one batch waits for its slowest task). A JPEG
cache of 256 px images is built from the bundled photos first (or --cache).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import flat_out, write


def make_cache(work: Path) -> Path:
    from fastdata.cache.build import BuildConfig, build_cache
    from fastdata.sample import make_image_folder

    src, cache = work / "src", work / "jpeg256"
    make_image_folder(src, 40, workers=2)
    build_cache(BuildConfig(src=str(src), dest=str(cache), size=256, encode="jpeg", progress=False))
    return cache


def check_jpeg_cache(cache: Path) -> None:
    """--cache must be a JPEG cache (its baseline sizes are what the pool is handed): else one line, exit 2."""
    from fastdata.errors import FastdataError
    from fastdata.read.encoded import EncodedSource

    try:
        kind = EncodedSource(cache).kind
    except FastdataError as e:
        kind = str(e)
    if kind != "cache-jpeg":
        print(f"{cache}: not a JPEG cache ({kind}); give one made by `fastdata build-cache SRC DEST --encode jpeg`, "
              f"or leave --cache out to build one from the sample photos", file=sys.stderr)
        raise SystemExit(2)


READ_PATHS = {"index, files": True, "shard walk, copied (before)": False}


def set_read_path(src, direct: bool) -> None:
    """direct: the default read path (spans from the sample index, the decode processes reading the cache's
    files); else the one before (spans walked shard by shard in src, the JPEGs copied into the slot).
    decode_pool.DIRECT_READS is module-wide: set it back with set_read_path(None, True)."""
    from fastdata.read.backends import decode_pool

    decode_pool.DIRECT_READS = direct
    if src is not None and not direct:
        src._index = None


def read_random(src, pool, slot, rng, n: int) -> None:
    """A reader's batch: n random samples' spans and sizes looked up, as a shuffled epoch reads them, then
    decoded by the pool into the slot."""
    batch = src.get_spans(np.sort(rng.choice(len(src), n)), sizes=True)
    h, w = batch.baseline_sizes()
    pool.decode(slot, batch, h, w, str)


def run(cache: Path, processes: int, readers: int, tasks: int, n: int, seconds: float, path: str) -> dict:
    """Reader threads flat out: each batch's spans and sizes looked up (random samples, as a shuffled
    epoch reads them), then decoded by the pool; `path` picks READ_PATHS' way of doing both."""
    from fastdata.read.backends import decode_pool
    from fastdata.read.encoded import EncodedSource

    src = EncodedSource(cache)
    set_read_path(src, READ_PATHS[path])
    pool = decode_pool.DecodePool(processes, readers)
    pool.per_batch, done = tasks, []

    def work(k, stop):
        slot, rng = decode_pool.Slot(), np.random.default_rng(k)
        while not stop.is_set():
            t0 = time.perf_counter()
            read_random(src, pool, slot, rng, n)
            done.append(time.perf_counter() - t0)
        slot.close()

    warm = decode_pool.Slot()
    for _ in range(processes):      # every process forked and warm, every shard indexed, before the clock
        read_random(src, pool, warm, np.random.default_rng(99), n)
    warm.close()
    c0 = time.process_time()
    wall = flat_out(work, readers, seconds)
    cpu = time.process_time() - c0
    pool.close()
    set_read_path(None, True)
    k = len(done)
    return {"read path": path, "tasks a batch": pool.per_batch, "batches": k, "img/s": k * n / wall,
            "loader CPU ms a batch": cpu / max(k, 1) * 1e3, "batch ms median": np.median(done) * 1e3,
            "batch ms p90": np.percentile(done, 90) * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tasks", default="", help="comma list of tasks a batch to compare (default: the pool's "
                    "own, decode_pool.tasks_per_batch, and one per process)")
    ap.add_argument("--cache", default=None, help="a JPEG cache to read (default: built from the sample photos)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    cache = Path(a.cache) if a.cache else make_cache(Path(tempfile.mkdtemp(prefix="fastdata-pool-")))
    if a.cache:
        check_jpeg_cache(cache)
    from fastdata.read.backends.decode_pool import tasks_per_batch

    try:
        splits = [int(v) for v in a.tasks.split(",")] if a.tasks else [tasks_per_batch(a.processes, a.readers),
                                                                           a.processes]
    except ValueError:
        ap.error(f"--tasks {a.tasks!r}: give whole numbers, comma separated, e.g. --tasks 3,12")
    rows = []
    for rnd in range(a.rounds):
        for k in splits:
            for path in READ_PATHS:
                r = {"round": rnd, **run(cache, a.processes, a.readers, k, a.batch, a.seconds, path)}
                print(r, flush=True)
                rows.append(r)
    write("pool-overhead", rows, ["round", "read path", "tasks a batch", "batches", "img/s", "loader CPU ms a batch",
                                  "batch ms median", "batch ms p90"],
          f"{a.processes} decode processes, {a.readers} reader threads, batches of {a.batch} 256 px cache JPEGs, "
          f"{a.seconds:.0f} s a row, rows alternating; a batch: its spans and sizes looked up for random samples "
          f"(sample_index.py, or the walk shard by shard), then decoded; batch ms: that read's wall time. "
          f"Rerun: `python benchmarks/pool_overhead.py --processes {a.processes} --readers {a.readers}"
          f"{f' --tasks {a.tasks}' if a.tasks else ''}`.", Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
