"""Why a CPU share of JPEG decoding slows a fast model's loop, in whichever form it runs.

    python benchmarks/share_probe.py [--model resnet18] [--seconds 4] [--processes 12] [--out DIR]

Decoding the CPU share in reader threads and in forked processes (decode_pool.py) lost alike beside
resnet18 on an H100 (27-31% of synthetic, host-probe-resnet18-jpeg-H100-...-2026-12-07.md), even at a
share of 1.0, where the GPU decodes nothing. So the cause is not the GIL of the decoding itself. Each
row runs the same compiled loop on a synthetic batch (the model never waits for data) beside one
thing, to separate the suspects:

- CPU contention: N processes spinning in pure Python (no memory traffic, no GIL of ours);
- the decode processes alone, and decoding flat out beside the loop (no GPU work of the loader);
- the loader with the share, its batches discarded, and fed;
and the fed loader under torch.profiler: its top host and device operations, by thread.
"""
from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from _common import cpu_model, write
from host_probe import loop
from models import SyntheticBatches, forever, make_data, make_model


def _spin(stop) -> None:
    while not stop.is_set():
        for _ in range(100000):
            pass


class Beside:
    """The synthetic batch, while `start(stop)` runs beside the loop until close()."""

    def __init__(self, syn, start) -> None:
        self.syn, self.stop = syn, threading.Event()
        self.done = start(self.stop)

    def __iter__(self):
        return iter(self.syn)

    def close(self) -> None:
        self.stop.set()
        if callable(self.done):
            self.done()


def spinners(n: int):
    def start(_stop):
        ctx = multiprocessing.get_context("fork")
        stop = ctx.Event()
        procs = [ctx.Process(target=_spin, args=(stop,), daemon=True) for _ in range(n)]
        for p in procs:
            p.start()

        def done():
            stop.set()
            for p in procs:
                p.join()
        return done
    return start


def decoding(jpeg: Path, processes: int, threads: int, n: int, counted: list):
    """Reader-like threads handing batches of n cache JPEGs to a DecodePool flat out."""
    from fastdata.read.backends.decode_pool import DecodePool, Slot
    from fastdata.read.encoded import EncodedSource

    src = EncodedSource(jpeg)
    batch = src.get_spans(np.arange(n))
    h, w = batch.baseline_sizes()
    pool = DecodePool(processes, threads)

    def start(stop):
        def work():
            slot = Slot()
            while not stop.is_set():
                pool.decode(slot, batch, h, w, str)
                counted.append(n)
            slot.close()
        ts = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
        for t in ts:
            t.start()

        def done():
            for t in ts:
                t.join()
            pool.close()
        return done
    return start


def decode_alone(jpeg: Path, processes: int, threads: int, seconds: float) -> dict:
    counted: list = []
    stop = threading.Event()
    done = decoding(jpeg, processes, threads, 128, counted)(stop)
    time.sleep(1.0)
    c0, t0 = sum(counted), time.perf_counter()
    time.sleep(seconds)
    rate = (sum(counted) - c0) / (time.perf_counter() - t0)
    stop.set()
    done()
    return {"img/s": float("nan"), "decoded img/s": rate}


def profiled(model, opt, loader, steps: int = 20) -> str:
    from torch.profiler import ProfilerActivity, profile

    it = iter(forever(loader))
    loop(model, opt, it, 1.0)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        loop(model, opt, it, 2.0, warmup=0)
    cpu = prof.key_averages().table(sort_by="cpu_time_total", row_limit=30)
    dev = prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)
    return f"## host ops (all threads)\n```\n{cpu}\n```\n## device ops\n```\n{dev}\n```\n"


def run_rows(model, opt, variants: list, seconds: float, counted: list) -> list[dict]:
    """One timed loop a (name, make, images_of) row; a row whose data fills `counted` (decoded images)
    gets their rate too. A failed row is kept with its error."""
    rows = []
    for name, make, images_of in variants:
        data, counted[:] = make(), []
        t0 = time.perf_counter()
        try:
            r = loop(model, opt, forever(data) if hasattr(data, "close") else data, seconds, images_of=images_of)
            if counted:
                r["decoded img/s"] = sum(counted) / (time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - a failed row must not cost the others
            r = {"img/s": float("nan"), "error": f"{type(e).__name__}: {e}"[:200]}
        finally:
            if hasattr(data, "close"):
                data.close()
        rows.append({"variant": name, **r})
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    import fastdata
    from fastdata.read.augment import AugmentConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--processes", type=int, default=12)
    ap.add_argument("--out", default=None)
    ap.add_argument("--work", default=None, help="folder for the data (kept; reused when present)")
    a = ap.parse_args()
    a.jpeg_backends, bs, dev = "nvjpeg", 256, torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    _, raw = make_data(a, Path(a.work or tempfile.mkdtemp(prefix="fastdata-share-")))
    jpeg = raw.with_name("jpeg256")
    model = torch.compile(make_model(a.model).to(dev, memory_format=torch.channels_last))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    syn = SyntheticBatches(bs, dev)
    aug = AugmentConfig(size=224, dtype="bfloat16")

    def fd(**kw):
        return fastdata.loader(jpeg, bs, backend="nvjpeg", device="cuda", augment=aug, drop_last=True, threads=8, **kw)

    p = a.processes
    share = {"cpu_share": 1.0, "cpu_processes": p}
    rows, counted = [], []
    variants = [
        ("synthetic bf16 batch", lambda: syn, None),
        (f"synthetic + {p} spinning processes", lambda: Beside(syn, spinners(p)), None),
        (f"synthetic + {p // 2} spinning processes", lambda: Beside(syn, spinners(p // 2)), None),
        (f"synthetic + {p} decode processes flat out (8 threads)", lambda: Beside(syn, decoding(jpeg, p, 8, 128, counted)),
         None),
        ("loader, torchvision decode_jpeg (default)", lambda: fd(), None),
        (f"loader, cpu share 1.0 in {p} processes, batches discarded", lambda: fd(**share), lambda b: syn.x),
        (f"loader, cpu share 1.0 in {p} processes", lambda: fd(**share), None),
    ]
    rows += run_rows(model, opt, variants, a.seconds, counted)
    rows.append({"variant": f"{p} decode processes alone (8 threads, batches of 128)",
                 **decode_alone(jpeg, p, 8, a.seconds)})
    for r in rows:
        r["vs synthetic"] = f"{r['img/s'] / rows[0]['img/s']:.1%}"
    loader = fd(**share)
    try:
        prof = profiled(model, opt, loader)
    finally:
        loader.close()
    write(f"share-probe-{a.model}", rows, ["variant", "img/s", "vs synthetic", "ms/step", "next() ms", "launch ms",
                                         "main cpu ms", "runq ms", "preempted", "blocked", "decoded img/s"],
          f"{cpu_model()}. {a.model}, batch 256, bf16, compiled, plain loop, {a.seconds:.0f} s a row. Rerun: `python "
          f"benchmarks/share_probe.py --model {a.model} --processes {p}`.\n\n# profile of the fed share-1.0 loader\n"
          + prof, Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
