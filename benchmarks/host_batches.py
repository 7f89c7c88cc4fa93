"""CPU batches from a raw cache in the page cache: how the batch buffer is mapped, by variant.

    python benchmarks/host_batches.py CACHE [--variants plain,populate,huge] [--repeat 2]

Why: every CPU batch is its own anonymous mapping (raw._host_images says why), and zero-filling it
page by page in the kernel's fault handler took most of the 2-core box's CPU. Each variant runs in
its own process (two epochs, the second reported), alternating: shared (Python's default for
mmap.mmap(-1, n): MAP_SHARED, so shmem pages), private (MAP_PRIVATE), private-populate (MAP_POPULATE),
private-huge (MADV_HUGEPAGE: transparent huge pages), private-huge-populate (then MADV_POPULATE_WRITE),
and code (raw._host_images as it is now).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _common import ROOT, write

CHILD = r"""
import json, mmap, resource, sys, time
import numpy as np, torch, fastdata
from fastdata.read.backends import raw
from fastdata.read.gather import advise_mapping
mode = sys.argv[2]

def host_images(shape):
    n = max(1, int(np.prod(shape)))
    flags = mmap.MAP_ANONYMOUS | (mmap.MAP_SHARED if mode == "shared" else mmap.MAP_PRIVATE)
    buf = mmap.mmap(-1, n, flags=flags | (mmap.MAP_POPULATE if mode == "private-populate" else 0))
    if "huge" in mode:
        advise_mapping(buf, n, raw._MADV_HUGEPAGE)
        if mode.endswith("populate"):
            advise_mapping(buf, n, 23)       # MADV_POPULATE_WRITE
    return torch.frombuffer(buf, dtype=torch.uint8).view(shape)

if mode == "code":
    host_images = raw._host_images          # the code as it is
raw._host_images = host_images
dl = fastdata.loader(sys.argv[1], 128, device="cpu", memory=None, integrity="off")
for epoch in range(2):
    r0, t0, n, nb = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), 0, 0
    for b in dl:
        n, nb = n + len(b[1]), nb + b[0].numel()
    dt, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"variant": mode, "img/s": n / dt, "MB/s": nb / dt / 1e6,
                  "user": round((r1.ru_utime - r0.ru_utime) / dt, 2),
                  "sys": round((r1.ru_stime - r0.ru_stime) / dt, 2)}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cache")
    ap.add_argument("--variants", default="shared,private,private-populate,private-huge,private-huge-populate,code")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    shards = sorted(Path(a.cache).glob("shard-*"))
    if not shards:
        print(f"{a.cache}: no shard-* files; give a raw cache folder made by `fastdata build-cache`", file=sys.stderr)
        raise SystemExit(2)
    for p in shards:                                  # into the page cache
        subprocess.run(["cat", str(p)], stdout=subprocess.DEVNULL, check=True)
    rows = []
    for mode in a.variants.split(",") * a.repeat:
        out = subprocess.run([sys.executable, "-c", CHILD, a.cache, mode], capture_output=True, text=True,
                             cwd=ROOT, check=True).stdout.strip().splitlines()[-1]
        rows.append(json.loads(out))
    write("host-batches", rows, ["variant", "img/s", "MB/s", "user", "sys"],
          f"Second epoch of fastdata.loader(CACHE, 128, device='cpu', memory=None) over {a.cache}, in the page "
          f"cache; user/sys: CPU seconds per wall second. Rerun: `python benchmarks/host_batches.py CACHE "
          f"--variants {a.variants} --repeat {a.repeat}`.")


if __name__ == "__main__":
    main()
