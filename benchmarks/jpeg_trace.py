"""Where resnet18 fed from a JPEG cache loses a quarter of its speed: a CUDA trace of the plain loop.

    python benchmarks/jpeg_trace.py [--model resnet18] [--seconds 0.8] [--out DIR]

host_probe.py --jpeg measured the loss (66-76% of synthetic, 2026-12-05) and ruled out the decoder's
speed (decode_lanes.py: 18-31k img/s alone) and its SM time (2%). Its "launch ms" column grew with the
loader, so the GPU ran each step longer or waited for launches. This traces the same compiled loop
with torch.profiler (CUPTI) for each row and reports:

- GPU busy: the union of every kernel, copy and memset over the window, and per stream;
- the training stream's idle time (the GPU waiting for launches) and its share of the window;
- time where the training stream and another stream both ran (contention for SMs and memory);
- CUDA runtime/driver calls by thread (main, or the other's id), the costliest first: a cudaFree, a
  synchronous copy or a host allocation in any thread stalls the launches behind it.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

from _common import write
from models import SyntheticBatches, forever, make_data, make_model


def union_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) spans, in the spans' unit."""
    total, end = 0.0, -1e30
    for s, e in sorted(spans):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def overlap_us(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Time covered by both span sets: |A| + |B| - |A or B|."""
    return union_us(a) + union_us(b) - union_us(a + b)


REGIONS = ("next", "forward", "backward", "optimizer")


def idle_causes(events: list, train: list, main_tid: int) -> dict[str, float]:
    """The training stream's gaps (us), by cause. A gap whose next kernel was launched after the stream
    went idle was the host's: named by the loop part the main thread was in when the GPU ran dry
    (REGIONS). A gap whose kernel was launched before it waited on something on the GPU: another
    stream's event (the loader's batch) or a sync."""
    launch = {ev["args"]["correlation"]: ev["ts"] + ev["dur"] for ev in events
              if ev.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in ev.get("args", {})}
    regions = sorted((ev["ts"], ev["ts"] + ev["dur"], ev["name"]) for ev in events
                     if ev.get("tid") == main_tid and ev.get("name") in REGIONS and "dur" in ev)
    causes: dict[str, float] = defaultdict(float)
    kernels = sorted(train, key=lambda ev: ev["ts"])
    for prev, ev in zip(kernels, kernels[1:]):
        end, start = prev["ts"] + prev["dur"], ev["ts"]
        if start - end < 5:
            continue
        issued = launch.get(ev.get("args", {}).get("correlation"))
        if issued is None or issued <= end:
            causes["GPU-side wait (another stream, a sync)"] += start - end
            continue
        where = next((name for s, e, name in regions if s <= end < e), "between parts")
        causes[f"host late, main thread in {where}"] += min(issued, start) - end
        causes["GPU-side wait (another stream, a sync)"] += max(0.0, start - issued)
    return dict(causes)


def summarise_trace(path: Path, main_tid: int, steps: int) -> dict:
    """Per step: GPU busy, training-stream idle, overlap, and the costliest runtime calls by thread role."""
    events = json.loads(path.read_text())["traceEvents"]
    by_stream: dict[int, list] = defaultdict(list)
    calls: dict[tuple[str, str], list[float]] = defaultdict(list)
    for ev in events:
        cat, dur = ev.get("cat", ""), ev.get("dur")
        if dur is None:
            continue
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            by_stream[int(ev.get("args", {}).get("stream", -1))].append(ev)
        elif cat in ("cuda_runtime", "cuda_driver"):
            calls[("main" if ev.get("tid") == main_tid else f"tid {ev.get('tid')}", ev["name"])].append(dur)
    if not by_stream:
        return {"error": "no GPU events in the trace"}
    train = max(by_stream, key=lambda s: len(by_stream[s]))
    causes = idle_causes(events, by_stream[train], main_tid)
    by_stream = {s: [(ev["ts"], ev["ts"] + ev["dur"]) for ev in got] for s, got in by_stream.items()}
    spans = [sp for got in by_stream.values() for sp in got]
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    window = hi - lo
    others = [sp for s, got in by_stream.items() if s != train for sp in got]
    per = 1e-3 / steps                     # us over the window -> ms per step
    top = sorted(calls.items(), key=lambda kv: -sum(kv[1]))[:10]
    return {
        "window ms/step": window * per, "GPU busy %": 100 * union_us(spans) / window,
        "train stream busy ms/step": union_us(by_stream[train]) * per,
        "train stream idle ms/step": (window - union_us(by_stream[train])) * per,
        "other streams busy ms/step": union_us(others) * per,
        "both busy ms/step": overlap_us(by_stream[train], others) * per,
        "idle ms/step by cause": {k: v * per for k, v in sorted(causes.items(), key=lambda kv: -kv[1])},
        "streams": {str(s): {"events": len(g), "busy ms/step": union_us(g) * per} for s, g in by_stream.items()},
        "calls": [{"thread": t, "name": n, "count/step": len(d) / steps, "ms/step": sum(d) * per,
                   "max ms": max(d) / 1e3} for (t, n), d in top],
    }


def run(model, opt, it, images_of, seconds: float) -> tuple[int, float]:
    """(steps, img/s) of the plain loop, its parts marked for the trace (REGIONS)."""
    from torch.profiler import record_function

    n = steps = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        with record_function("next"):
            batch = next(it)
        x = images_of(batch) if images_of else batch[0]
        with record_function("forward"), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), batch[1])
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        n, steps = n + len(batch[1]), steps + 1
    torch.cuda.synchronize()
    return steps, n / (time.perf_counter() - t0)


def traced(model, opt, data, images_of, seconds: float, trace: Path) -> dict:
    """Warm the row untraced, then trace `seconds` of it."""
    from torch.profiler import ProfilerActivity, profile

    it = iter(data)
    run(model, opt, it, images_of, 1.0)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        steps, rate = run(model, opt, it, images_of, seconds)
    prof.export_chrome_trace(str(trace))
    return {"img/s (traced)": rate, **summarise_trace(trace, threading.get_native_id(), steps)}


def main() -> None:
    import fastdata
    from fastdata.read.augment import AugmentConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--seconds", type=float, default=0.8, help="traced seconds per row")
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.jpeg_backends = "nvjpeg"
    torch.backends.cudnn.benchmark = True
    work = Path(a.work or tempfile.mkdtemp(prefix="fastdata-trace-"))
    _, raw = make_data(a, work)
    bs, dev = a.batch_size, torch.device("cuda")
    model = torch.compile(make_model(a.model).to(dev, memory_format=torch.channels_last))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    syn = SyntheticBatches(bs, dev)
    aug = AugmentConfig(size=224, dtype="bfloat16")

    def jpeg(**kw):
        return fastdata.loader(raw.with_name("jpeg256"), bs, device="cuda", augment=aug, drop_last=True,
                               backend="nvjpeg", threads=8, **kw)

    rows_in = [("synthetic bf16 batch", lambda: forever(syn), None),
               ("jpeg loader, engines", lambda: jpeg(hardware=True), None),
               ("jpeg loader, torchvision", lambda: jpeg(hardware=False), None),
               ("jpeg loader, engines, batches discarded", lambda: jpeg(hardware=True), lambda b: syn.x),
               ("raw loader", lambda: fastdata.loader(raw, bs, device="cuda", augment=aug, drop_last=True,
                                                      threads=8), None)]
    rows, detail = [], {}
    for k, (name, make, images_of) in enumerate(rows_in):
        data = make()
        try:
            src = forever(data) if hasattr(data, "close") else data
            got = traced(model, opt, src, images_of, a.seconds, work / f"trace{k}.json")
        finally:
            if hasattr(data, "close"):
                data.close()
        detail[name] = got
        print(name, json.dumps({k: v for k, v in got.items() if k != "calls"}), flush=True)
        rows.append({"row": name, **{c: got.get(c, float("nan")) for c in COLS[1:]}})
    write(f"jpeg-trace-{a.model}", rows, COLS,
          f"{a.model}, batch {bs}, bf16, compile default, plain loop; {a.seconds} s traced per row after 1 s "
          f"untraced, torch.profiler (CUPTI) on, so rates are below host_probe's. Per-row stream and "
          f"runtime-call detail in the JSON. Rerun: `python benchmarks/jpeg_trace.py --model {a.model}`.\n\n"
          f"```\n{json.dumps({n: {k: d.get(k) for k in ('idle ms/step by cause', 'calls')} for n, d in detail.items()}, indent=1)}\n```",
          Path(a.out) if a.out else None)


COLS = ["row", "img/s (traced)", "window ms/step", "GPU busy %", "train stream busy ms/step",
        "train stream idle ms/step", "other streams busy ms/step", "both busy ms/step"]

if __name__ == "__main__":
    main()
