"""Where a host-bound loop loses time to the loader: one model, one plain loop, many loader variants.

    python benchmarks/host_probe.py [--model resnet18] [--seconds 4] [--out DIR]

A compiled ResNet-18 step of 256 images takes ~14 ms on the H200 and the host needs nearly as long
to launch it, so every millisecond the loader costs the main thread, directly or by taking the GIL
from it, is lost. Each row runs the same compiled loop and reports img/s, its ratio to a synthetic
batch, and per step the host milliseconds spent in next(loader) and in the rest of the step (the
launches), and the main thread's CPU time per step: wall time above it is the main thread waiting
(for the GIL, or for the GPU). Variants separate the loader's parts: no augmentation, the augmentation alone on a
uint8 batch already on the GPU, reader thread counts, the kernels, the GIL switch interval.
"""
from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _common import cpu_model, write
from models import SyntheticBatches, forever, make_data, make_model

log = logging.getLogger("host_probe")


def loop(model, opt, batches, seconds: float, warmup: int = 15, images_of=None) -> dict:
    it = iter(batches)
    t_next = t_rest = 0.0

    def step():
        nonlocal t_next, t_rest
        t0 = time.perf_counter()
        batch = next(it)
        t1 = time.perf_counter()
        x = images_of(batch) if images_of else batch[0]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), batch[1])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t_next, t_rest = t_next + t1 - t0, t_rest + time.perf_counter() - t1
        return len(batch[1])

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    t_next = t_rest = 0.0
    n = steps = 0
    sched0, cpu0, t0 = _sched(), time.thread_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += step()
        steps += 1
    torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    runq, preempted, blocked, others = (b - a for a, b in zip(sched0, _sched()))
    return {"img/s": n / wall, "ms/step": wall / steps * 1e3, "next() ms": t_next / steps * 1e3,
            "launch ms": t_rest / steps * 1e3, "main cpu ms": cpu / steps * 1e3,
            "runq ms": runq / steps * 1e3, "preempted": preempted / steps, "blocked": blocked / steps,
            "others blocked": others / steps,
            "graphs": _graphs()}


def _sched() -> tuple[float, int, int, int]:
    """This thread's time runnable but waiting for a CPU (s, /proc/thread-self/schedstat; nan where the
    kernel lacks it), its involuntary context switches (the host's CPUs taken, by decode processes) and
    its voluntary ones: each time it blocked, on the GIL among others (a loader thread taking the GIL
    back makes the training thread block for it: benchmarks/gil_convoy.py), or on the GPU."""
    try:
        waited = int(open("/proc/thread-self/schedstat").read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        waited = float("nan")
    use = resource.getrusage(resource.RUSAGE_THREAD)
    return waited, use.ru_nivcsw, use.ru_nvcsw, _others_blocked()


def _others_blocked() -> int:
    """Voluntary switches of this process's other threads (loader threads, torch's autograd thread): each
    is a thread going to sleep, and most wake again to take the GIL back."""
    me, total = threading.get_native_id(), 0
    for task in os.scandir("/proc/self/task"):
        if task.name == str(me):
            continue
        try:
            with open(f"{task.path}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))
        except (OSError, StopIteration, ValueError):
            pass
    return total


def _graphs() -> int:
    """Graphs torch.compile has made so far: a rise between rows means the loader's batch recompiled."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def augment_only(bs: int):
    """A uint8 batch on the GPU augmented every step by the loader's kernel, plan drawn per step."""
    from fastdata.read.augment import AugmentConfig, apply_plan, plan_tensor
    from fastdata.read.crop import draw_plan

    x = torch.randint(0, 256, (bs, 256, 256, 3), dtype=torch.uint8, device="cuda")
    y = torch.randint(0, 100, (bs,), device="cuda")
    cfg = AugmentConfig(size=224, dtype="bfloat16")
    k = 0
    while True:
        k += 1
        plan = plan_tensor(draw_plan(cfg, k, np.full(bs, 256), np.full(bs, 256)), x.device)
        yield apply_plan(x, plan, cfg), y


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--base-seconds", type=float, default=None, help="seconds of the synthetic row (default: "
                    "--seconds); short, a profile of the whole run is mostly the other rows'")
    ap.add_argument("--warmup", type=int, default=15, help="untimed steps a row starts with (a steered CPU share "
                    "settles in its first ~100 batches)")
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--size", type=int, default=224, help="training resolution (the crop's side): a lower one "
                    "makes the model faster than the loader's decode processes")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=1, help="run the variants this many times, alternating")
    ap.add_argument("--jpeg", action="store_true", help="the JPEG-cache contention variants (_jpeg_probe.py) "
                    "instead of the raw-cache ones")
    ap.add_argument("--rate", type=float, default=70.0, help="batches/s of the --jpeg decode-only variants")
    ap.add_argument("--decode-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--only", default="", help="substrings split at '|' (or, with no '|', at "
                    "commas): run the variants naming one (and the synthetic row)")
    return ap.parse_args()


def main() -> None:
    import fastdata
    from fastdata.read.augment import AugmentConfig

    a = _args()
    if a.decode_child:
        import _jpeg_probe

        return _jpeg_probe.child(a.decode_child, a.batch_size, a.rate)
    a.jpeg_backends = "nvjpeg" if a.jpeg else ""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    torch.backends.cudnn.benchmark = True
    src, raw = make_data(a, Path(a.work or tempfile.mkdtemp(prefix="fastdata-probe-")))
    bs, dev = a.batch_size, torch.device("cuda")
    model = make_model(a.model).to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model = torch.compile(model)
    syn = SyntheticBatches(bs, dev, a.size)

    def fd(cache=raw, **kw):
        aug = kw.pop("augment", AugmentConfig(size=a.size, dtype="bfloat16",
                                                  kernel=kw.pop("kernel", "auto")))
        return fastdata.loader(cache, bs, device="cuda", augment=aug, drop_last=True, **{"threads": 8, **kw})

    if a.jpeg:
        import _jpeg_probe

        variants = _jpeg_probe.variants(fd, syn, raw.with_name("jpeg256"), bs, a.rate)
    else:
        variants = raw_variants(fd, syn, bs)
    if a.only:
        keep = a.only.split("|" if "|" in a.only else ",")
        variants = [v for v in variants if v[0] == variants[0][0] or any(k in v[0] for k in keep)]
        log.info("rows: %s", "; ".join(v[0] for v in variants))
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    for rnd in range(a.rounds):
        for name, make, images_of in variants:
            try:
                base = name == variants[0][0] and a.base_seconds is not None
                r = run_variant(model, opt, make, images_of, fd, a.base_seconds if base else a.seconds, a.warmup)
            except Exception as e:  # noqa: BLE001 - one failing variant must not cost the others' rows
                log.exception("round %d %s failed", rnd, name)
                r = {"img/s": float("nan"), "error": f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"}
            runs[name].append(r)
            log.info("round %d %s: %s", rnd, name, r)
        _write(a, bs, runs, rnd + 1)       # after every round: a device call cut short keeps the rounds done


def raw_variants(fd, syn, bs: int) -> list:
    """(name, make, images_of) rows of the raw-cache probe; fd(**kw) makes a fastdata.loader."""
    from _lead import Fenced

    return [
        ("synthetic bf16 batch", lambda: forever(syn), None),
        ("augment only (uint8 on GPU, triton)", lambda: augment_only(bs), None),
        ("loader, augment off (synthetic x)", lambda: fd(augment=None), lambda b: syn.x),
        ("loader triton, 8 threads", lambda: fd(), None),
        ("loader triton, 4 threads", lambda: fd(threads=4), None),
        ("loader triton, 2 threads", lambda: fd(threads=2), None),
        ("loader compiled kernel, 8 threads", lambda: fd(kernel="compiled"), None),
        ("loader eager kernel, 8 threads", lambda: fd(kernel="eager"), None),
        ("loader triton, switch interval 0.2 ms", "switch", None),
        ("synthetic bf16 batch, 3 batches in flight (fenced)", lambda: Fenced(forever(syn), 3), None),
        ("loader triton, 8 threads, max_inflight_batches=0 (unbounded: before)",
         lambda: fd(max_inflight_batches=0), None),
        ("loader triton, 8 threads, max_inflight_batches=2", lambda: fd(max_inflight_batches=2), None),
        ("loader triton, 8 threads, max_inflight_batches=3 (= default since 2026-12-07)",
         lambda: fd(max_inflight_batches=3), None),
    ]


JPEG_COLS = ["read wait ms", "late %", "cpu share %"]      # _jpeg_probe.Tweaked.stats()
JPEG_NOTE = ("; read wait ms / late %: the mean wait for a read a batch and the share of batches that waited "
             "(warm-up included); cpu share %: the nvjpeg backend's CPU share at the row's end")


def _write(a, bs: int, runs: dict[str, list[dict]], done: int) -> None:
    cols = ["variant", "img/s", "vs synthetic", "ms/step", "next() ms", "launch ms", "main cpu ms", "runq ms",
            "preempted", "blocked", "others blocked", "graphs"] + (JPEG_COLS if a.jpeg else [])
    flags = "".join([f" --rounds {a.rounds}" if a.rounds > 1 else "", " --jpeg" if a.jpeg else "",
                     f" --size {a.size}" if a.size != 224 else "",
                     f" --warmup {a.warmup}" if a.warmup != 15 else "", f" --only '{a.only}'" if a.only else ""])
    write(f"host-probe-{a.model}{'-jpeg' if a.jpeg else ''}", summarise(runs),
          cols + (["per-round ratio"] if done > 1 else []),
          f"{cpu_model()}. {a.model}, batch {bs}, {a.size} px, bf16, compile default, plain loop; "
          f"{a.seconds:.0f} s per row, {done} of {a.rounds} round(s), variants alternating; medians. runq ms: the "
          f"main thread's time runnable but off a CPU a step; preempted / blocked: its involuntary / voluntary "
          f"switches a step; others blocked: the other threads' voluntary switches a step"
          f"{JPEG_NOTE if a.jpeg else ''}. "
          f"Rerun: `python benchmarks/host_probe.py --model {a.model}{flags}`.",
          Path(a.out) if a.out else None)


def run_variant(model, opt, make, images_of, fd, seconds: float, warmup: int = 15) -> dict:
    """One timed loop; a loader made for it is closed after (its pinned ring and threads go)."""
    if make == "switch":
        old = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)
        try:
            return run_variant(model, opt, fd, None, fd, seconds, warmup)
        finally:
            sys.setswitchinterval(old)
    data = make()
    try:
        out = loop(model, opt, forever(data) if hasattr(data, "close") else data, seconds, warmup, images_of)
        return {**out, **data.stats()} if hasattr(data, "stats") else out
    finally:
        if hasattr(data, "close"):
            data.close()


def summarise(runs: dict[str, list[dict]]) -> list[dict]:
    """Per variant: the median of each column over rounds, and each round's ratio to that round's
    synthetic run (the first variant)."""
    base = next(iter(runs.values()))
    rows = []
    for name, got in runs.items():
        errors = sorted({r["error"] for r in got if "error" in r})
        ok = [r for r in got if "error" not in r] or [{"img/s": float("nan")}]
        row = {"variant": name + (f" (failed: {'; '.join(errors)})" if errors else ""),
               **{k: float(np.median([r[k] for r in ok])) for k in ok[0]}}
        ratios = [r["img/s"] / b["img/s"] for r, b in zip(got, base)]
        row["vs synthetic"] = f"{np.nanmedian(ratios):.1%}" if not np.isnan(ratios).all() else "failed"
        if len(got) > 1:
            row["per-round ratio"] = " ".join(f"{v:.1%}" for v in ratios)
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()
