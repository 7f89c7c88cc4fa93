"""Whether the CPU share's decode processes should yield the CPUs to the training thread.

    python benchmarks/decode_priority.py [--processes 12] [--readers 8] [--nice 0,5,10,19] [--seconds 5]

The nvjpeg backend's default share runs 12 decode processes beside a training thread that launches
kernels: once the host's CPUs are all busy (12 processes, 8 reader threads, the GPU thread and the
training thread on 16 CPUs), the scheduler shares a CPU between the training thread and a decoder, and
every millisecond it waits for one is a millisecond of the GPU idle. The decoders' work can wait
(the steer gives their share back to the GPU when they fall behind); the launches cannot. Here the main
thread stands in for the training thread (tiny torch ops in a loop, GIL held as a launch holds it)
while `readers` threads hand batches to a DecodePool flat out, its processes at each niceness in turn.
Reported: the main thread's ops/s against alone, and the images decoded a second. Rows alternate over
rounds; the JPEG cache of 256 px images is built from the bundled photos (or --cache).
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from _common import cpu_model, tiny_ops, write
from pool_overhead import READ_PATHS, check_jpeg_cache, make_cache, read_random, set_read_path


def beside_pool(cache: Path, processes: int, readers: int, nice: int, n: int, seconds: float,
                rate: float = 0.0, path: str | None = None) -> dict:
    """tiny_ops() in this thread while `readers` threads decode batches of n in a DecodePool, `rate`
    batches a second between them (0: flat out). path (pool_overhead.READ_PATHS): each batch's spans
    are looked up for random samples that way first, as the nvjpeg backend's readers do; None: one
    batch, looked up once."""
    from fastdata.read.backends import decode_pool
    from fastdata.read.encoded import EncodedSource

    src = EncodedSource(cache)
    if path is not None:
        set_read_path(src, READ_PATHS[path])
    fixed = src.get_spans(np.arange(n) % len(src), sizes=True)
    pool = decode_pool.DecodePool(processes, readers, nice=nice)
    stop, done = threading.Event(), []

    def read(slot, rng):
        if path is not None:
            return read_random(src, pool, slot, rng, n)
        pool.decode(slot, fixed, *fixed.baseline_sizes(), str)

    def work(k):
        slot, due, rng = decode_pool.Slot(), time.perf_counter(), np.random.default_rng(k)
        while not stop.is_set():
            if rate:        # paced as a training loop consumes batches: each reader one in `readers`
                due += readers / rate
                time.sleep(max(0.0, due - time.perf_counter()))
            read(slot, rng)
            done.append(1)
        slot.close()

    warm = decode_pool.Slot()
    for _ in range(processes):     # every process forked and warm (and every shard indexed) before the clock
        read(warm, np.random.default_rng(99))
    warm.close()
    threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(readers)]
    for t in threads:
        t.start()
    time.sleep(0.5)                          # the readers at full pace before the clock
    k0, t0 = len(done), time.perf_counter()
    ops = tiny_ops(seconds)
    k, wall = len(done) - k0, time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    pool.close()
    set_read_path(None, True)
    return {"main ops/s": ops, "img/s": k * n / wall}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--readers", type=int, default=8)
    ap.add_argument("--nice", default="0,5,10,19", help="comma list of the decode processes' niceness")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rate", type=float, default=0.0, help="batches a second the readers decode between them "
                    "(0: flat out); paced, what remains is the pool's GIL traffic, not its CPU")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--read-paths", action="store_true", help="rows by the readers' way of finding a batch's "
                    "bytes (pool_overhead.READ_PATHS, random samples each batch) at the first --nice level")
    ap.add_argument("--cache", default=None, help="a JPEG cache to read (default: built from the sample photos)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    try:
        levels = [int(v) for v in a.nice.split(",")]
    except ValueError:
        ap.error(f"--nice {a.nice!r}: give whole numbers 0-19, comma separated, e.g. --nice 0,10")
    torch.set_num_threads(1)
    cache = Path(a.cache) if a.cache else make_cache(Path(tempfile.mkdtemp(prefix="fastdata-prio-")))
    if a.cache:
        check_jpeg_cache(cache)
    rows = []
    for rnd in range(a.rounds):
        alone = tiny_ops(a.seconds)
        rows.append({"decoders": "none (main thread alone)", "round": rnd, "main ops/s": alone, "vs alone": "100.0%"})
        for name, nice, path in ([(f"nice {levels[0]}, {p}", levels[0], p) for p in READ_PATHS] if a.read_paths
                                 else [(f"nice {v}", v, None) for v in levels]):
            r = beside_pool(cache, a.processes, a.readers, nice, a.batch, a.seconds, a.rate, path)
            rows.append({"decoders": name, "round": rnd, **r, "vs alone": f"{r['main ops/s'] / alone:.1%}"})
            print(rows[-1], flush=True)
    write("decode-priority", rows, ["decoders", "round", "main ops/s", "vs alone", "img/s"],
          f"{cpu_model()}. {a.processes} decode processes, {a.readers} reader threads handing them batches of "
          f"{a.batch} 256 px cache JPEGs {f'at {a.rate:g} batches/s' if a.rate else 'flat out'}; the main thread "
          f"runs tiny torch ops for {a.seconds:.0f} s a row; rows alternate. Rerun: `python "
          f"benchmarks/decode_priority.py --processes {a.processes} --readers {a.readers} --nice {a.nice} "
          f"--batch {a.batch}{f' --rate {a.rate:g}' if a.rate else ''}{' --read-paths' if a.read_paths else ''}`.",
          Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
