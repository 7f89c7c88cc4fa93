"""A raw cache bigger than the loader's memory, read for some epochs, against the disk's sequential rate.

    python benchmarks/out_of_ram.py [--images 16000] [--size 224] [--memory 1GB] [--epochs 2] [--rows stream,mmap]

Each row runs in a child process placed in a memory cgroup of --memory (page cache charged; the
child's own start-up memory is charged before it joins), after the cache's pages were dropped from
the page cache (posix_fadvise DONTNEED). Reported: img/s, MB/s, MB/s against `dd iflag=direct` over
the same shard files in the same run, bytes read from storage per cache byte (/proc/<pid>/io: 1.0
means no sample was read twice) and the cgroup's peak memory. Needs root for the cgroup (falls back
to no cgroup, saying so). Rows: stream (the loader's streaming mode, with the cgroup's budget) and
mmap (memory=None: the in-RAM path, for comparison).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, write

CHILD = r"""
import json, os, sys, time
import fastdata
cache, mode, bs, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
print("ready", flush=True)
sys.stdin.readline()                     # the parent has put this process in the cgroup: budget from it
budget = os.environ.get("OOR_BUDGET") or "auto"   # set where no cgroup could be made
threads = int(os.environ["OOR_THREADS"]) if os.environ.get("OOR_THREADS") else None
import fastdata.read.stream
fastdata.read.stream.FILL = os.environ.get("OOR_FILL") or fastdata.read.stream.FILL
fastdata.read.stream.FILL_THREADS = int(os.environ.get("OOR_FILL_THREADS") or fastdata.read.stream.FILL_THREADS)
device = "cuda" if __import__("torch").cuda.is_available() else "cpu"
make = fastdata.loader                   # (imports torch and the reader: not part of opening the cache)
t_open = time.perf_counter()
dl = make(cache, bs, device=device, memory=None if mode == "mmap" else budget, integrity="off", threads=threads)
fill = fastdata.read.stream.FILL if dl.backend._streamer is not None else ""
t_open = time.perf_counter() - t_open

def read_bytes():
    return int(dict(l.split(": ") for l in open("/proc/self/io").read().splitlines())["read_bytes"])

out = []
for epoch in range(epochs):
    io0, t0, n, first = read_bytes(), time.perf_counter(), 0, None
    for b in dl:
        n += len(b[1])
        if first is None:
            first, n_first = time.perf_counter() - t0, n
    dt = time.perf_counter() - t0
    cov = dl.coverage()
    out.append({"images": n, "seconds": dt, "first": first, "after_first": (n - n_first) / n, "open": t_open,
                "read_bytes": read_bytes() - io0, "seen": cov["seen"],
                "repeated": cov["repeated"], "window": dl.order.cfg.window,
                "streaming": dl.backend._streamer is not None,
                "fill": f"{fill} x{fastdata.read.stream.FILL_THREADS}" if fill == "populate" else fill})
print(json.dumps(out), flush=True)
"""


def _drop_pages(files: list[Path]) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def _dd_rate(files: list[Path]) -> float:
    total, t0 = 0, time.perf_counter()
    for p in files:
        subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=8M", "iflag=direct"], check=True,
                       capture_output=True)
        total += p.stat().st_size
    return total / (time.perf_counter() - t0)


def _cgroup(limit: int) -> Path | None:
    cg = Path("/sys/fs/cgroup/memory") / f"fastdata-bench-{os.getpid()}"
    try:
        cg.mkdir(exist_ok=True)
        (cg / "memory.limit_in_bytes").write_text(str(limit))
        return cg
    except OSError:
        return None


def _row(cache: Path, mode: str, bs: int, limit: int, files: list[Path], epochs: int) -> list[dict]:
    """One child process reading `epochs` epochs of the cache; a row per epoch."""
    _drop_pages(files)
    probe = _cgroup(limit)
    if probe is not None:
        probe.rmdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if probe is None:
        env["OOR_BUDGET"] = str(limit)
    if "-" in mode:     # stream-advise, stream-populate[xN]: the streaming row with that FILL (N threads)
        mode, fill = mode.split("-", 1)
        env["OOR_FILL"], _, env["OOR_FILL_THREADS"] = fill.partition("x")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(cache), mode, str(bs), str(epochs)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    assert child.stdout.readline().strip() == "ready"
    cg = _cgroup(limit)
    if cg is not None:
        (cg / "cgroup.procs").write_text(str(child.pid))
    child.stdin.write("go\n")
    child.stdin.flush()
    out = child.stdout.readline()
    child.wait()
    peak = int((cg / "memory.max_usage_in_bytes").read_text()) if cg is not None else None
    if cg is not None:
        cg.rmdir()
    if not out:
        return [{"row": mode, "error": f"child exited {child.returncode} (killed by the cgroup?)"}]
    rows = json.loads(out)
    for epoch, r in enumerate(rows, 1):
        r.update(row=mode, epoch=epoch, cgroup=cg is not None, peak_mb=peak / 1e6 if peak else None)
    return rows


def main() -> None:
    from fastdata._util import parse_size
    from fastdata.cache.build import BuildConfig, build_cache
    from fastdata.sample import make_image_folder

    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=16000)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--memory", default="1GB")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=2, help="epochs per row: the first starts cold, later ones "
                    "are the steady state of a training run")
    ap.add_argument("--rows", default="stream,mmap", help="comma list of stream, mmap, stream-advise, "
                    "stream-populate, stream-populatexN (stream.FILL for that row; N: FILL_THREADS)")
    ap.add_argument("--repeat", type=int, default=1, help="run the rows this many times, alternating")
    ap.add_argument("--tag", default="", help="appended to the result's file name")
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="fastdata-oor-"))
    src = work / "src"
    if not src.exists():
        make_image_folder(src, per_class=a.images // 10)
    cache = work / f"raw{a.size}"
    build_cache(BuildConfig(src=str(src), dest=str(cache), size=a.size, progress=False))
    files = sorted(cache.glob("shard-*"))
    total = sum(p.stat().st_size for p in files)
    limit = parse_size(a.memory)
    rows = []
    for mode in a.rows.split(",") * a.repeat:
        before = _dd_rate(files)   # (O_DIRECT: the page cache neither helps nor changes; _row drops it)
        got = _row(cache, mode, a.batch_size, limit, files, a.epochs)
        dd = (before + _dd_rate(files)) / 2   # this disk's rate drifts: the mean of dd before and after the row
        for r in got:
            if "seconds" in r:
                mbps = total / r["seconds"]
                r.update({"img/s": r["images"] / r["seconds"], "MB/s": mbps / 1e6, "dd MB/s": dd / 1e6,
                          "x dd": f"{mbps / dd:.2f}", "open s": f"{r['open']:.2f}" if r["epoch"] == 1 else "",
                          "first batch s": f"{r['first']:.2f}",
                          "x dd after it": f"{total * r['after_first'] / (r['seconds'] - r['first']) / dd:.2f}",
                          "disk x dd": f"{r['read_bytes'] / r['seconds'] / dd:.2f}",
                          "read / cache bytes": f"{r['read_bytes'] / total:.3f}"})
            rows.append(r)
    notes = (f"Cache {cache}: {total / 1e9:.2f} GB ({len(files)} shards of {a.size} px raw); memory cgroup "
             f"{a.memory} ({total / limit:.1f}x smaller than the cache); dd iflag=direct over the same files "
             f"before and after each row (their mean). {a.epochs} epoch(s) per row in one process, page cache dropped before the "
             f"first: epoch 1 starts cold, later epochs are a training run's steady state (their first "
             f"batches were read ahead at the end of the epoch before). x dd: the epoch's cache bytes per second over "
             f"dd's; disk x dd: the bytes the process read from storage (/proc/self/io) per second over dd's (below "
             f"x dd where some pages were still cached from the epoch before). first batch s: from the epoch's "
             f"first request to its first batch (the loader was made before, its shards' metadata read cold: "
             f"'open s'); x dd after it: the rest of the epoch's bytes per second over dd's, the rate an "
             f"epoch of a large data set is made of.\n\nRerun: "
             f"`python benchmarks/out_of_ram.py --images {a.images} --size {a.size} --memory {a.memory} "
             f"--epochs {a.epochs} --rows {a.rows}{f' --repeat {a.repeat}' if a.repeat > 1 else ''}`")
    write(f"out-of-ram{'-' + a.tag if a.tag else ''}", rows, ["row", "epoch", "streaming", "fill", "window", "img/s", "MB/s", "dd MB/s", "x dd",
                               "open s", "first batch s", "x dd after it",
                               "read / cache bytes", "disk x dd", "seen", "repeated", "peak_mb", "cgroup"], notes)


if __name__ == "__main__":
    main()
