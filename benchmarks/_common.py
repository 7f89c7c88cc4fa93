"""Helpers shared by the benchmarks: machine description, tables, result files."""
from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"


def machine() -> dict:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"host": platform.node(), "cpus": len(os.sched_getaffinity(0)), "gpu": gpu,
            "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.date.today().isoformat()}


def cpu_model() -> str:
    """The CPU's model and how the usable CPUs pair into cores, for results that depend on the host: a
    launch-bound loop ran at 3.7 ms of CPU a step on one H100 host and 6.6-7.2 on another."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?")
    cpus = sorted(os.sched_getaffinity(0))
    cores = set()
    for c in cpus:
        try:
            cores.add(Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read_text().strip())
        except OSError:
            cores.add(str(c))
    return f"{name}, {len(cpus)} CPUs on {len(cores)} cores"


def tag() -> str:
    m = machine()
    kind = (m["gpu"] or f"cpu{m['cpus']}").replace(" ", "-").replace("NVIDIA-", "")
    return f"{kind}-{m['date']}"


def peak_rss_mb() -> float:
    """Peak resident memory of this process and its finished children, in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 1024


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:,.1f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def write(name: str, rows: list[dict], cols: list[str], notes: str = "", out_dir: Path | None = None) -> Path:
    out_dir = out_dir or RESULTS
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{tag()}"
    md = f"# {name} on {machine()}\n\n{table(rows, cols)}\n\n{notes}\n"
    (out_dir / f"{stem}.md").write_text(md)
    (out_dir / f"{stem}.json").write_text(json.dumps({"machine": machine(), "rows": rows, "notes": notes}, indent=1))
    print(md)
    return out_dir / f"{stem}.md"


class Synthetic:
    """One batch already on the device, handed out `n` times: the loader can never be the bottleneck."""

    def __init__(self, bs: int, size: int, device: torch.device, n: int = 100_000) -> None:
        self.x = torch.randn(bs, 3, size, size, device=device).contiguous(memory_format=torch.channels_last)
        self.y = torch.randint(0, 10, (bs,), device=device)
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        return ((self.x, self.y) for _ in range(self.n))


def drain(dl, seconds: float, device: torch.device | None = None) -> float:
    """img/s a loader alone delivers over `seconds`, after 3 warm-up batches, restarting epochs as needed.
    With `device`, batches are moved there (a CPU DataLoader's batches count only once on the GPU)."""
    cuda = torch.cuda.is_available()

    def batches():
        while True:
            yield from dl

    it, n = batches(), 0
    for _ in range(3):
        next(it)
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        images = next(it)[0]
        n += len(images.to(device, non_blocking=True) if device is not None else images)
    if cuda:
        torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def data_args(per_class: int = 100, size: int = 224, seconds: float = 5.0, batch_size: int = 256):
    """The argument parser the loader benchmarks share: data set size, image size, timing, batch."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=per_class)
    ap.add_argument("--size", type=int, default=size)
    ap.add_argument("--seconds", type=float, default=seconds)
    ap.add_argument("--batch-size", type=int, default=batch_size)
    return ap


def flat_out(work, threads: int, seconds: float) -> float:
    """Run work(k, stop) in `threads` threads (k = 0..threads-1) until `seconds` have passed and stop is
    set; the wall seconds they ran."""
    import threading

    stop = threading.Event()
    pool = [threading.Thread(target=work, args=(k, stop), daemon=True) for k in range(threads)]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    return time.perf_counter() - t0


def tiny_ops(seconds: float) -> float:
    """Tiny torch ops a second in this thread, standing in for a training thread that launches
    kernels: each holds the GIL and a CPU for microseconds, as a launch does."""
    x = torch.zeros(8)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        x.add_(1)
        n += 1
    return n / (time.perf_counter() - t0)
