"""Summarise a `py-spy record --gil --threads --format raw` file: GIL samples per thread, and each
thread's top stacks (leaf frame plus the nearest fastdata/torchvision/benchmarks frame).

    python tools/pyspy_summary.py pyspy.txt [--top 12]

With --gil py-spy samples only the thread holding the GIL, so a thread's share of the samples is its
share of the GIL over the recording.
"""
from __future__ import annotations

import argparse
import collections
import re


def parse(path: str):
    for line in open(path, encoding="utf-8", errors="replace"):
        line = line.rstrip("\n")
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        thread = next((f for f in frames if f.startswith("thread")), "thread ?")
        yield thread, [f for f in frames if not f.startswith(("thread", "process"))], int(count)


def label(frames: list[str]) -> str:
    leaf = frames[-1] if frames else "?"
    ours = next((f for f in reversed(frames) if re.search(r"fastdata|torchvision|benchmarks|_jpeg_probe|host_probe", f)),
                "")
    return f"{leaf}  <-  {ours}" if ours and ours != leaf else leaf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args()
    per_thread: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for thread, frames, n in parse(a.path):
        per_thread[thread][label(frames)] += n
    total = sum(sum(c.values()) for c in per_thread.values()) or 1
    for thread, c in sorted(per_thread.items(), key=lambda kv: -sum(kv[1].values())):
        n = sum(c.values())
        print(f"{thread}: {n} samples, {n / total:.1%} of the samples (of GIL samples under --gil)")
        for what, k in c.most_common(a.top):
            print(f"    {k / n:6.1%}  {what[:200]}")


if __name__ == "__main__":
    main()
