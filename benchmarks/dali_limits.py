"""Where DALI's decode from JPEG files stops scaling: each stage alone, then the whole loader.

    python benchmarks/dali_limits.py --src IMAGE_FOLDER [--seconds 3] [--batch-size 256]

Issue 4 asks for >= 90% of synthetic speed from raw files, and DALI from files
delivered 8-11k img/s however the decoding was split (hardware decoder, CPU
Huffman, GPU Huffman) while neither the SMs nor the JPEG engines were busy.
This takes the pipeline apart on the same files:

    read         fn.readers.file alone (DALI's C++ file reader)
    decode       + fn.decoders.image, mixed, hardware decoder share 1.0 or 0 (nothing else)
    2 pipelines  two bare decode pipelines driven in turn: if the pair doubles the rate, one
                 pipeline's batch latency, not the decoder, is the limit
    loader       fastdata's dali backend (crop, resize, normalise, copies to torch), with the
                 native file reader or the Python feed, 1-3 pipelines in turn, 4 / 8 / 16 CPU threads

Each row also reports GPM SM activity and the JPEG engines' NVML utilization.
Writes Markdown + JSON to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import torch

from _common import drain, write

log = logging.getLogger("dali-limits")


def _bare(files: list[str], bs: int, threads: int, stage: str, hw: float):
    """A pipeline of only the reader, or the reader and the decoder; outputs stay inside DALI."""
    from nvidia import dali
    from nvidia.dali import fn, types

    pipe = dali.pipeline.Pipeline(batch_size=bs, num_threads=threads, device_id=0, prefetch_queue_depth=2)
    with pipe:
        encoded, label = fn.readers.file(files=files, random_shuffle=True, seed=1)
        if stage == "read":
            pipe.set_outputs(label)
        else:
            pipe.set_outputs(fn.decoders.image(encoded, device="mixed", output_type=types.RGB,
                                               hw_decoder_load=hw), label)
    pipe.build()
    return pipe


def _rate(pipes: list, bs: int, seconds: float) -> float:
    """img/s of pipelines run in turn (each run() returns a finished batch and schedules the next)."""
    for p in pipes:
        p.run()
    torch.cuda.synchronize()
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for p in pipes:
            p.run()
            n += bs
    torch.cuda.synchronize()
    return n / (time.perf_counter() - t0)


def rows_for(a, files: list[str]):
    """(name, callable returning img/s) for every measured setting."""
    from fastdata.read.verbs import decode_loader

    bs, s, t = a.batch_size, a.seconds, a.threads

    def loader(**kw):
        return lambda: drain(decode_loader(a.src, bs, backend="dali", dtype="bfloat16", hw_decoder_load=1.0,
                                           **{"threads": t, **kw}), s)

    yield "read: fn.readers.file alone", lambda: _rate([_bare(files, bs, t, "read", 1.0)], bs, s)
    yield "decode: hardware decoder 1.0", lambda: _rate([_bare(files, bs, t, "decode", 1.0)], bs, s)
    yield "decode: hardware decoder off", lambda: _rate([_bare(files, bs, t, "decode", 0.0)], bs, s)
    yield "decode: 2 pipelines, hardware 1.0", lambda: _rate(
        [_bare(files, bs, t // 2, "decode", 1.0) for _ in range(2)], bs, s)
    yield "decode: 2 pipelines, hardware off", lambda: _rate(
        [_bare(files, bs, t // 2, "decode", 0.0) for _ in range(2)], bs, s)
    yield "loader: native file reader", loader(file_reader="native")
    yield "loader: Python feed", loader(file_reader="feed")
    yield "loader: native, 2 pipelines in turn", loader(file_reader="native", pipelines=2)
    yield "loader: native, 3 pipelines in turn", loader(file_reader="native", pipelines=3)
    for threads in (4, 8, 16):
        yield f"loader: native, {threads} threads", loader(file_reader="native", threads=threads)


def main() -> None:
    from fastdata._util import usable_cpus
    from fastdata.cache.sources import discover
    from fastdata.monitor.nvml import GpuSampler

    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="image folder of JPEGs")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=usable_cpus())
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if not torch.cuda.is_available():
        raise SystemExit("dali_limits measures the GPU decode path: run it on a machine with a GPU")
    files = [str(item.path) for item in discover(a.src).items]
    rows = []
    for name, fn in rows_for(a, files):
        try:
            with GpuSampler() as sampler:
                rate = fn()
            use = sampler.summary()
            rows.append({"stage": name, "img/s": rate, "SM activity %": use.get("sm_util", float("nan")),
                         "JPEG engine %": use.get("jpeg_engine_util", float("nan"))})
        except Exception as e:  # noqa: BLE001 - one failing setting must not lose the others
            log.exception("%s failed", name)
            rows.append({"stage": name, "img/s": 0.0, "note": f"FAILED: {e}"[:140]})
        log.info("%s", rows[-1])
    notes = (f"{len(files)} JPEG files from {Path(a.src).name}, batch {a.batch_size}, {a.threads} DALI CPU threads "
             f"unless said, {a.seconds:.0f} s per row. Rerun: `python benchmarks/dali_limits.py --src DIR`.")
    write("dali-limits", rows, ["stage", "img/s", "SM activity %", "JPEG engine %", "note"], notes,
          Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
