"""Peak memory of a build worker against the size of the shard it writes.

    python benchmarks/build_memory.py [--per-class 200] [--size 256]

Each row builds one shard holding every input (in a fresh process, in-process build, so its peak RSS
is the worker's), for each shard format, and reports the peak RSS beyond a tiny build's (imports and
fixed buffers) against the shard's size. The writer is
meant to hold a shard once (writers.py); before it held an h5 shard twice and a .pt shard three times.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, write

CHILD = """
import json, resource, sys
import fastdata.cache.build as b
b.MIN_SHARDS = 1                      # one shard holding every input
r = b.build_cache(b.BuildConfig(src=sys.argv[1], dest=sys.argv[2], size=int(sys.argv[3]), workers=0,
                                progress=False, shard_size="64GB", format=sys.argv[4]))
print(json.dumps({"shard_mb": r.manifest.shards[0].bytes / 2**20, "n": r.manifest.num_samples,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

def child(code: str, *args: str, tree: Path = ROOT) -> dict:
    """Run code in a fresh interpreter that imports fastdata from `tree` (this checkout, or another)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tree, check=True,
                         env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=200)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--out", default=None)
    ap.add_argument("--before", default=None, help="another checkout (git worktree) to measure beside this one")
    a = ap.parse_args()
    from fastdata.sample import make_image_folder

    tmp = Path(tempfile.mkdtemp(prefix="fastdata-bench-"))
    try:
        src = make_image_folder(tmp / "src", a.per_class)
        small = make_image_folder(tmp / "small", 1)     # the same process's fixed cost: imports, buffers
        rows = []
        trees = [("this tree", ROOT)] + ([(f"--before {a.before}", Path(a.before))] if a.before else [])
        for fmt in ("h5", "pt"):
            for name, tree in trees:
                base = child(CHILD, str(small), str(tmp / f"s-{fmt}"), str(a.size), fmt, tree=tree)
                r = child(CHILD, str(src), str(tmp / f"c-{fmt}"), str(a.size), fmt, tree=tree)
                shutil.rmtree(tmp / f"c-{fmt}")
                shutil.rmtree(tmp / f"s-{fmt}")
                rows.append({"format": fmt, "code": name, "samples": r["n"], "shard MB": r["shard_mb"],
                             "peak RSS MB": r["peak_mb"], f"{base['n']}-sample build MB": base["peak_mb"],
                             "peak / shard": r["peak_mb"] / r["shard_mb"]})
        write("build-memory", rows, list(rows[0]), f"One shard of {a.size} px raw samples, built in one process "
              f"(a build worker's job). Rerun: `python benchmarks/build_memory.py --per-class {a.per_class} "
              f"--size {a.size}` (--before DIR: another checkout, e.g. a git worktree, measured in the same run).", Path(a.out) if a.out else None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
