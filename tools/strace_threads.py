"""System calls made by one process's threads (not its forked children), from `strace -ff -o PREFIX`.

    strace -ff -o /tmp/st/tr python benchmarks/pool_overhead.py --cache C --rounds 1 --seconds 2 --tasks 3
    python tools/strace_threads.py /tmp/st/tr

A loader thread that returns from a system call takes the GIL back from the training thread
(benchmarks/gil_convoy.py), and a futex call is a thread waiting for, or waking, another: counted per
thread of the traced process, the calls a batch of two runs of different lengths (the difference over
the difference in batches) are a deterministic measure of that traffic where timings are too noisy.
The traced process is the lowest thread id; its threads are those it (or they) cloned with CLONE_THREAD.
"""
from __future__ import annotations

import collections
import glob
import re
import sys


def thread_calls(prefix: str) -> tuple[int, collections.Counter]:
    files = {int(f.rsplit(".", 1)[1]): f for f in glob.glob(prefix + ".*") if f.rsplit(".", 1)[1].isdigit()}
    if not files:
        print(f"{prefix}: no strace files (run strace -ff -o {prefix} ...)", file=sys.stderr)
        raise SystemExit(2)
    root = min(files)
    threads, todo = {root}, [root]
    while todo:
        for line in open(files[todo.pop()], errors="replace"):
            m = re.match(r"clone3?\((.*)\)\s+=\s+(\d+)", line)
            if m and "CLONE_THREAD" in m.group(1) and int(m.group(2)) in files and int(m.group(2)) not in threads:
                threads.add(int(m.group(2)))
                todo.append(int(m.group(2)))
    counts: collections.Counter = collections.Counter()
    for t in threads:
        for line in open(files[t], errors="replace"):
            m = re.match(r"(\w+)\(", line)
            if m:
                counts[m.group(1)] += 1
    return len(threads), counts


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python tools/strace_threads.py PREFIX  (the -o PREFIX given to strace -ff)", file=sys.stderr)
        raise SystemExit(2)
    n, calls = thread_calls(sys.argv[1])
    print(f"{n} threads; {sum(calls.values())} system calls; futex {calls['futex']}; top: {calls.most_common(8)}")
