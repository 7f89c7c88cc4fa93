"""Ways to read cache shards into the page cache ahead of the readers, each from cold, against dd.

    python benchmarks/fill_methods.py CACHE [--shards 12]

Why: stream.py's read-ahead first announced shards with posix_fadvise(WILLNEED) and let the kernel read;
this compares that with side threads that fault whole shards in (madvise(MADV_POPULATE_READ) over a
mapping: no copy) or read them (preadv into a scratch buffer: a copy), on the same shards, each row
after the shards' pages were dropped. MB/s is the shards' bytes over the wall time; cores is this
process's CPU time over it (dd's own is not counted).
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import write
from out_of_ram import _dd_rate, _drop_pages


def _willneed_all_then_read(files) -> None:
    fds = [os.open(p, os.O_RDONLY) for p in files]
    for fd in fds:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    for fd in fds:
        while os.read(fd, 8 << 20):
            pass
        os.close(fd)


def _pread(path) -> None:
    fd, buf, off = os.open(path, os.O_RDONLY), memoryview(bytearray(8 << 20)), 0
    while (n := os.preadv(fd, [buf], off)) > 0:
        off += n
    os.close(fd)


def _threads(fn, k: int):
    def run(files):
        with ThreadPoolExecutor(k) as ex:
            list(ex.map(fn, files))
    return run


def main() -> None:
    from fastdata.read.stream import populate

    ap = argparse.ArgumentParser()
    ap.add_argument("cache")
    ap.add_argument("--shards", type=int, default=12)
    a = ap.parse_args()
    files = sorted(Path(a.cache).glob("shard-*"))[: a.shards]
    if not files:
        print(f"{a.cache}: no shard-* files; give a cache folder made by `fastdata build-cache`", file=sys.stderr)
        raise SystemExit(2)
    total = sum(p.stat().st_size for p in files)
    methods = [("dd iflag=direct bs=8M", _dd_rate), ("WILLNEED on all, then read each", _willneed_all_then_read),
               ("populate, 1 thread", _threads(populate, 1)), ("populate, 2 threads", _threads(populate, 2)),
               ("populate, 4 threads", _threads(populate, 4)), ("preadv 8 MB, 2 threads", _threads(_pread, 2)),
               ("dd iflag=direct bs=8M, again", _dd_rate)]
    rows = []
    for name, fn in methods:
        _drop_pages(files)
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        fn(files)
        dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
        cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
        rows.append({"method": name, "MB/s": total / dt / 1e6, "cores": f"{cpu / dt:.2f}"})
    write("fill-methods", rows, ["method", "MB/s", "cores"],
          f"{len(files)} shards, {total / 1e9:.2f} GB, of {a.cache}; each row from cold (posix_fadvise DONTNEED). "
          f"Rerun: `python benchmarks/fill_methods.py CACHE --shards {a.shards}`.")


if __name__ == "__main__":
    main()
