"""What a loader thread's GIL wake-ups cost a launching training thread, whatever the thread does.

    python benchmarks/gil_convoy.py [--seconds 3] [--rounds 2]

On H100 hosts the training thread's CPU a step rose by a third beside any loader variant, the
GPU-only one included, though it never waited for a CPU (host_probe.py's runq column). A suspect is
the GIL convoy: each time a loader thread returns from a system call or a torch op that released the
GIL, it takes the GIL back from the training thread, which then waits for it (and for two context
switches) even if the loader thread's Python work is a few microseconds. Here the main thread runs
tiny torch ops (_common.tiny_ops) while `threads` threads each wake every `period` and spin `work` us
in Python, holding the GIL: the main thread's pace against alone, per wake-up rate and work. The CPU
the wakers use is their wake-ups times their work (the column waker CPU %). The same wakers in another
process (no GIL shared) separate the GIL's cost from the CPUs'.
"""
from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from pathlib import Path

import torch

from _common import cpu_model, tiny_ops, write

CASES = [(1, 1.0, 20), (8, 5.0, 2), (8, 5.0, 20), (8, 1.0, 2), (8, 1.0, 20), (8, 10.0, 200)]  # threads, ms, us
APART = [(8, 5.0, 2), (8, 1.0, 20)]     # also run in another process: the same wake-ups without our GIL


def _waker(stop: threading.Event, period: float, work: float) -> None:
    while not stop.is_set():
        time.sleep(period)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < work:
            pass


def _wakers(stop, threads: int, period_ms: float, work_us: float) -> None:
    ts = [threading.Thread(target=_waker, args=(stop, period_ms / 1e3, work_us / 1e6), daemon=True)
          for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def beside(threads: int, period_ms: float, work_us: float, seconds: float, apart: bool = False) -> float:
    """tiny_ops' rate while the wakers run in threads of this process, or (apart) of a child process."""
    if apart:
        ctx = multiprocessing.get_context("fork")
        stop = ctx.Event()
        run = ctx.Process(target=_wakers, args=(stop, threads, period_ms, work_us), daemon=True)
    else:
        stop = threading.Event()
        run = threading.Thread(target=_wakers, args=(stop, threads, period_ms, work_us), daemon=True)
    run.start()
    time.sleep(0.2)
    try:
        return tiny_ops(seconds)
    finally:
        stop.set()
        run.join()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    rows = []
    for rnd in range(a.rounds):
        alone = tiny_ops(a.seconds)
        for threads, period, work, apart in [(*c, False) for c in CASES] + [(*c, True) for c in APART]:
            got = beside(threads, period, work, a.seconds, apart)
            rows.append({"round": rnd, "wakers in": "another process" if apart else "this process",
                         "threads": threads, "wake every ms": period, "work us": work,
                         "wake-ups/s": threads * 1e3 / period, "waker CPU %": threads * work / period / 10,
                         "main ops/s": got, "vs alone": f"{got / alone:.1%}"})
            print(rows[-1], flush=True)
    write("gil-convoy", rows, ["round", "wakers in", "threads", "wake every ms", "work us", "wake-ups/s", "waker CPU %",
                               "main ops/s", "vs alone"],
          f"{cpu_model()}. Main thread: tiny torch ops for {a.seconds:.0f} s a row, each round against its own "
          f"run alone. Rerun: `python benchmarks/gil_convoy.py --seconds {a.seconds:g} --rounds {a.rounds}`.",
          Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
