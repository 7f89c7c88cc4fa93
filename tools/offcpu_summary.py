"""Summarise a `py-spy record --native --idle --threads --format raw` file: per thread, what each sample was
doing, running or asleep (waiting for the GIL, a CUDA sync, the autograd engine, a kernel launch).

    python tools/offcpu_summary.py offcpu.txt [--top 14] [--threads 6]

Each sample is labelled by the first frame from its leaf that names a known wait (WAITS), else by its leaf,
and by its nearest Python frame: a thread's share of samples per label is its share of wall time there.
"""
from __future__ import annotations

import argparse
import collections
import re

from pyspy_summary import parse

WAITS = [       # (label, regex on a native frame), the first match from the leaf wins
    ("GIL wait", r"take_gil|PyEval_RestoreThread|PyEval_AcquireThread|PyGILState_Ensure"),
    ("CUDA event sync", r"EventSynchronize"),
    ("CUDA stream sync", r"StreamSynchronize"),
    ("CUDA device sync", r"DeviceSynchronize|CtxSynchronize"),
    ("CUDA memcpy", r"[Mm]emcpy"),
    ("CUDA host alloc/free", r"HostAlloc|FreeHost|HostRegister|HostUnregister|MemHostAlloc"),
    ("kernel launch", r"LaunchKernel|cuLaunch"),
    ("autograd engine", r"autograd::Engine"),
    ("sleep / select", r"nanosleep|select|poll\b|epoll"),
    ("pipe read/write", r"\bread\b|\bwrite\b|__libc_read|__libc_write"),
]


def label(frames: list[str]) -> tuple[str, str]:
    """(wait or leaf, nearest Python frame) of one sample, its frames root first."""
    wait = next((name for f in reversed(frames) for name, rx in WAITS if re.search(rx, f)), None)
    py = next((f for f in reversed(frames) if ".py:" in f), "(no Python frame)")
    if wait is None and frames and "libc.so" in frames[-1]:     # unnamed libc code (a futex wait, mostly): by its caller
        caller = next((f for f in reversed(frames) if "libc.so" not in f), "?")
        # a bare wait under Python's own code is the GIL (take_gil is static: no symbol in most builds)
        wait = f"libc under {caller}" if ".py:" not in caller and "python" not in caller.lower() else "libc under Python"
    return wait or (frames[-1] if frames else "?"), py


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--threads", type=int, default=6)
    a = ap.parse_args()
    per_thread: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for thread, frames, n in parse(a.path):
        per_thread[thread][label(frames)] += n
    print(f"== {a.path}")
    for thread, c in sorted(per_thread.items(), key=lambda kv: -sum(kv[1].values()))[:a.threads]:
        n = sum(c.values())
        waits = collections.Counter()
        for (what, _), k in c.items():
            waits[what if any(what == w for w, _ in WAITS) else "other"] += k
        print(f"{thread}: {n} samples; " + ", ".join(f"{w} {k / n:.0%}" for w, k in waits.most_common()))
        for (what, py), k in c.most_common(a.top):
            print(f"    {k / n:6.1%}  {what[:90]}  <-  {py[:110]}")


if __name__ == "__main__":
    main()
