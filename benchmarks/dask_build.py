"""Dask executor overhead: build-cache on a Dask LocalCluster against the local process pool.

    python benchmarks/dask_build.py [--per-class 100] [--size 256] [--reps 2]

Same inputs, same options, same number of worker processes; rows alternate (local, dask, running
cluster, ...) and each row is one `fastdata build-cache` command in its own process, timed from
start to exit: interpreter start, cluster start-up and shutdown included (what a user waits for).
The running cluster is started once by this script, and the command connects to it (dask://). Goal (issue #22): Dask within 10% of the local pool.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import write


def main() -> None:
    from fastdata._util import usable_cpus
    from fastdata.cache.format import load_manifest
    from fastdata.sample import make_image_folder

    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=100)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    workers = usable_cpus()
    tmp = Path(tempfile.mkdtemp(prefix="fastdata-dask-"))
    try:
        src = make_image_folder(tmp / "src", a.per_class)
        n = sum(1 for _ in src.rglob("*.jpg"))
        from dask.distributed import LocalCluster

        running = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        warm = "dask://" + running.scheduler_address.split("://", 1)[1]
        rows = []
        for rep in range(a.reps):
            for executor in ("local", "dask", warm):
                dest = tmp / f"{executor.replace('/', '_').replace(':', '_')}-{rep}"
                cmd = [sys.executable, "-m", "fastdata.cli", "build-cache", str(src), str(dest), "--size",
                       str(a.size), "--workers", str(workers), "--executor", executor, "--no-progress"]
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)   # what a user runs, start to end
                wall = time.perf_counter() - t0
                m = load_manifest(dest)
                name = "dask (running cluster)" if executor == warm else executor
                rows.append({"executor": name, "rep": rep, "wall s": wall, "img/s": m.num_samples / wall,
                             "shards": len(m.shards)})
                same = all((dest / s.name).read_bytes() == (tmp / f"local-{rep}" / s.name).read_bytes()
                           for s in m.shards)
                rows[-1]["identical to local"] = same
            for d in tmp.glob(f"*-{rep}"):
                shutil.rmtree(d)
        running.close()
        kinds = ("local", "dask", "dask (running cluster)")
        best = {e: min(r["wall s"] for r in rows if r["executor"] == e) for e in kinds}
        notes = (f"{n} JPEGs (~500x375), size {a.size}, {workers} worker processes. Best wall: local "
                 f"{best['local']:.2f} s; dask with its own LocalCluster {best['dask']:.2f} s "
                 f"({best['dask'] / best['local'] - 1:+.1%}, cluster start-up and shutdown included); dask on a "
                 f"running cluster {best[kinds[2]]:.2f} s ({best[kinds[2]] / best['local'] - 1:+.1%})."
                 f"\n\nRerun: `python benchmarks/dask_build.py "
                 f"--per-class {a.per_class} --size {a.size} --reps {a.reps}`")
        write("dask-build", rows, ["executor", "rep", "wall s", "img/s", "shards", "identical to local"], notes)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
