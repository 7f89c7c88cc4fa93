"""What nvJPEG's hardware backend launches per batch, by output format, alone and beside training.

    python benchmarks/hw_output.py [--per-class 300] [--models resnet18,resnet50] [--seconds 4]

jpeg-trace-resnet18-H100-2026-12-05 counted, per 256-image batch on the loader's GPU thread, ~265
cudaMemcpyAsync, ~265 cudaLaunchKernel, ~265 cudaEventRecord and ~253 cudaEventSynchronize: work per
image inside nvjpegDecodeBatched. The engines decode YCbCr; with NVJPEG_OUTPUT_RGB something must
convert. This probe asks which of those calls belong to the colour conversion, by decoding the same
batches (a 256 px JPEG cache as build-cache makes it: PIL quality 90, 4:2:0) to planar RGB and to
planar YUV (the engines' own format), and reports

  * per batch: kernels by name, copies by kind, CUDA runtime calls by name (torch.profiler);
  * decode alone, flat out: img/s;
  * beside a compiled bf16 training loop (synthetic batch) with a thread decoding flat out and at the
    training's own rate: the training's img/s against training alone in the same run.

Run 1 (hw-output-H100-80GB-HBM3-2026-12-06-yuv.md): per image, nvJPEG copies the bitstream from
pageable memory (Memcpy HtoD Pageable -> Device), then converts with one rgba2rgb kernel (RGB) or three
2-D device copies (YUV), then waits on an event: a serial round trip per image, so decoding is bound
by latency, which the training's kernels stretch. YUV did not help. This version (not yet run on a
GPU): the same bitstreams in pinned memory (the loader's pinned=True slots) against pageable, one
and two decoders in parallel threads, alone and beside the same training, in rounds (training alone
measured in every round, ratios paired). --formats rgb,yuv adds the YUV census and decode-alone rows.
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _common import write
from models import SyntheticBatches, make_data, make_model

_OUTPUT = {"rgb": 3, "yuv": 1}      # nvjpegOutputFormat_t


def yuv_table(base: int, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """nvjpegImage_t words for planar Y, Cb, Cr of 4:2:0 images, back to back from base."""
    h, w = heights.astype(np.uint64), widths.astype(np.uint64)
    ch, cw = (h + 1) // 2, (w + 1) // 2
    size = h * w + 2 * ch * cw
    offsets = np.zeros(len(h), np.uint64)
    np.cumsum(size[:-1], out=offsets[1:])
    table = np.zeros((len(h), 8), np.uint64)
    table[:, 0] = base + offsets
    table[:, 1] = base + offsets + h * w
    table[:, 2] = base + offsets + h * w + ch * cw
    table[:, 4], table[:, 5], table[:, 6] = w, cw, cw
    return table


def pinned(batch):
    """The batch packed into pinned host memory, as the loader's pinned=True slots hold it (the numpy
    view keeps the pinned tensor alive)."""
    return batch.packed(torch.empty(batch.nbytes(), dtype=torch.uint8, pin_memory=True).numpy())


def decode(dec, batch, fmt: str, stream) -> torch.Tensor:
    """One batch decoded by fastdata's HardwareJpegDecoder, in `fmt`, queued on `stream`."""
    if fmt == "rgb":
        return dec.decode(*batch.pointers(), *batch.baseline_sizes(), stream).base
    h, w = batch.baseline_sizes()
    entry = dec._states[dec._turn]
    dec._turn = (dec._turn + 1) % len(dec._states)
    if entry[1] is not None:
        entry[1].synchronize()
    total = int((h * w + 2 * ((h + 1) // 2) * ((w + 1) // 2)).sum())
    with torch.cuda.stream(stream):
        out = torch.empty(total, dtype=torch.uint8, device="cuda")
        table = yuv_table(out.data_ptr(), h, w)
        ptrs, lens = batch.pointers()
        ptrs, lens = np.ascontiguousarray(ptrs, np.uint64), np.ascontiguousarray(lens, np.uint64)
        status = dec.lib.nvjpegDecodeBatchedInitialize(dec._handle, entry[0], len(h), 1, _OUTPUT[fmt])
        status = status or dec.lib.nvjpegDecodeBatched(dec._handle, entry[0], ptrs.ctypes.data, lens.ctypes.data,
                                             table.ctypes.data, ctypes.c_void_p(stream.cuda_stream))
        if status != 0:
            raise RuntimeError(f"nvjpegDecodeBatched{{Initialize,}}({fmt}) returned {status}")
        entry[1] = torch.cuda.Event()
        entry[1].record(stream)
    return out


def census(dec, batches, fmt: str, stream, n: int = 4) -> dict:
    """Per batch: kernels by name, copies by kind, runtime calls by name (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    for b in batches[:2]:
        decode(dec, b, fmt, stream)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in batches[:n]:
            decode(dec, b, fmt, stream)
        torch.cuda.synchronize()
    kinds: dict[str, collections.Counter] = {"kernel": collections.Counter(), "copy": collections.Counter(),
                                              "runtime": collections.Counter()}
    gpu_us = collections.Counter()
    for e in prof.events():
        name, on_gpu = e.name, "CUDA" in str(getattr(e, "device_type", ""))
        if on_gpu:
            kind = "copy" if name.startswith(("Memcpy", "Memset")) else "kernel"
            kinds[kind][name[:70]] += 1
            gpu_us[name[:70]] += e.time_range.elapsed_us()
        elif name.startswith(("cuda", "cu")):
            kinds["runtime"][name] += 1
    return {k: {name: round(c / n, 1) for name, c in v.most_common(8)} for k, v in kinds.items()} | {
        "gpu us/batch": {name: round(t / n, 1) for name, t in gpu_us.most_common(6)}}


def decode_alone(decs, batches, fmt: str, seconds: float) -> float:
    """img/s of len(decs) threads, each decoding flat out with its own decoder and stream."""
    t0 = time.perf_counter()
    sides = [Beside(d, batches, fmt, 0.0, offset=3 * i) for i, d in enumerate(decs)]
    time.sleep(seconds)
    for side in sides:
        side.close()
    return sum(side.images for side in sides) / (time.perf_counter() - t0)


class Beside:
    """A thread decoding batches in `fmt` (rate batches/s, 0 = flat out) while the loop trains."""

    def __init__(self, dec, batches, fmt: str, rate: float, offset: int = 0) -> None:
        self.stop, self.images = threading.Event(), 0
        self.thread = threading.Thread(target=self._run, args=(dec, batches, fmt, rate, offset), daemon=True)
        self.thread.start()

    def _run(self, dec, batches, fmt, rate, k):
        stream = torch.cuda.Stream()
        period, t_next = (1.0 / rate if rate else 0.0), time.perf_counter()
        while not self.stop.is_set():
            decode(dec, batches[k % len(batches)], fmt, stream)
            self.images += len(batches[k % len(batches)])
            k += 1
            t_next += period
            time.sleep(max(0.0, t_next - time.perf_counter()))
        stream.synchronize()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def train(model, opt, syn, seconds: float, warmup: int = 10) -> float:
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(syn.x), syn.y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += syn.x.shape[0]
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


# (label, batches kind, decoder threads, at the training's rate?) beside training
BESIDE = [("pageable, 1 decoder, flat out", "pageable", 1, False),
          ("pinned, 1 decoder, flat out", "pinned", 1, False),
          ("pinned, 2 decoders, flat out", "pinned", 2, False),
          ("pinned, 2 decoders, at training rate", "pinned", 2, True),
          ("pageable, 2 decoders, flat out", "pageable", 2, False)]


def model_rows(name: str, decs, sets: dict, bs: int, seconds: float, rounds: int) -> list[dict]:
    dev = torch.device("cuda")
    model = torch.compile(make_model(name).to(dev, memory_format=torch.channels_last))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    syn = SyntheticBatches(bs, dev)
    train(model, opt, syn, 3.0, warmup=30)
    got: dict[str, list] = {"training alone": []}
    for _ in range(rounds):
        base = train(model, opt, syn, seconds)
        got["training alone"].append((base, 1.0, None))
        for label, kind, threads, at_rate in BESIDE:
            rate = base / bs / threads if at_rate else 0.0
            sides = [Beside(d, sets[kind], "rgb", rate, offset=3 * i) for i, d in enumerate(decs[:threads])]
            t0 = time.perf_counter()
            img = train(model, opt, syn, seconds)
            wall = time.perf_counter() - t0
            for side in sides:
                side.close()
            got.setdefault(label, []).append((img, img / base, sum(s.images for s in sides) / wall))
            print(name, label, got[label][-1], flush=True)
    return [{"row": f"{name}: {label}", "train img/s": float(np.median([r[0] for r in v])),
             "vs alone": f"{np.median([r[1] for r in v]):.1%}", "per-round": " ".join(f"{r[1]:.1%}" for r in v),
             "decode img/s": "" if v[0][2] is None else float(np.median([r[2] for r in v]))}
            for label, v in got.items()]


def main() -> None:
    from fastdata.cache.hw_decode import HardwareJpegDecoder
    from fastdata.read.encoded import EncodedSource

    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=300)
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the rows beside training")
    ap.add_argument("--decode-rounds", type=int, default=2, help="rounds of the decode-alone rows")
    ap.add_argument("--formats", default="rgb", help="nvJPEG outputs of the census and decode-alone rows: "
                    "rgb (the loader's), yuv (the engines' own planes; 4:2:0 caches only)")
    ap.add_argument("--work", default=None, help="where the photos and caches are made (kept for a rerun)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    a.jpeg_backends = "nvjpeg"
    torch.backends.cudnn.benchmark = True
    _, raw = make_data(a, Path(a.work or tempfile.mkdtemp(prefix="fastdata-hwout-")))
    src = EncodedSource(raw.with_name("jpeg256"))
    bs = a.batch_size
    batches = [src.get_spans(np.arange(lo, lo + bs)) for lo in range(0, len(src) - bs + 1, bs)]
    sets = {"pageable": batches, "pinned": [pinned(b) for b in batches]}
    decs, stream = [HardwareJpegDecoder(torch.device("cuda")) for _ in range(2)], torch.cuda.Stream()
    rows, notes, formats = [], {}, a.formats.split(",")
    for fmt in formats:
        for kind in ("pageable", "pinned"):
            notes[f"{fmt}, {kind}"] = census(decs[0], sets[kind], fmt, stream)
            print(fmt, kind, notes[f"{fmt}, {kind}"], flush=True)
    for _ in range(a.decode_rounds):
        for fmt in formats:
            for kind in ("pageable", "pinned"):
                for threads in (1, 2):
                    rows.append({"row": f"decode alone, {fmt}, {kind}, {threads} decoder(s)",
                                 "decode img/s": decode_alone(decs[:threads], sets[kind], fmt, 3.0)})
                    print(rows[-1], flush=True)
    for name in filter(None, a.models.split(",")):
        rows += model_rows(name, decs, sets, bs, a.seconds, a.rounds)
    for dec in decs:
        dec.close()
    rerun = (f"python benchmarks/hw_output.py --per-class {a.per_class} --models {a.models} --formats {a.formats} "
             f"--rounds {a.rounds} --decode-rounds {a.decode_rounds}")
    write("hw-output", rows, ["row", "train img/s", "vs alone", "per-round", "decode img/s"],
          f"{len(batches)} batches of {bs} from a 256 px JPEG cache (PIL q90 4:2:0); decoder: fastdata's "
          f"HardwareJpegDecoder (nvJPEG hardware backend, 2 states each); resnets compiled, bf16, synthetic "
          f"batch, {a.rounds} rounds, medians. Per-batch census (torch.profiler):\n\n"
          f"```\n{json.dumps(notes, indent=1)}\n```\n\nRerun: `{rerun}`.", Path(a.out) if a.out else None)

if __name__ == "__main__":
    main()
