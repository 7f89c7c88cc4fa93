"""host_probe.py's JPEG-cache variants: where resnet18 fed by nvJPEG loses a third of its speed.

Stop 30 found the cause (torchvision's decode_jpeg, 15-17 ms of the GPU thread's 18 ms a batch, all
calls behind one mutex and a stream sync); the rows now set the NVJPG engines (hw_decode.py) against
it. Earlier rows (2 threads, switch interval, stream priority, a decode process) are in the results
of 2026-12-04.

Decoding alone outruns the model 1.6x and keeps the SMs 2% busy (decode.py), so the loss is
contention. The variants say which kind, each against the same compiled loop on a synthetic batch:

- the loader's batches discarded (the model trains on the synthetic batch): the loader does all
  its work, the model never waits for data. As slow as the fed row -> contention, not lateness.
- nvJPEG decoding in another process at the model's batch rate: the GPU, its JPEG engines, the
  PCIe link and the CPU cores are shared, the GIL and the CUDA context are not.
- nvJPEG decoding in a thread of this process at that rate, without the loader: the decode call
  alone, with its GIL and context share.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from pool_overhead import set_read_path


def encoded_batch(jpeg_cache: Path, n: int) -> list[torch.Tensor]:
    from fastdata.read.encoded import EncodedSource

    encoded, _ = EncodedSource(jpeg_cache).get_batch(list(range(n)))
    return [torch.from_numpy(e.copy()) for e in encoded]


def decode_forever(batch: list[torch.Tensor], rate: float, stop: threading.Event | None = None) -> None:
    """torchvision's batched nvJPEG decode of one batch, `rate` times a second (0: flat out)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    period, t_next = (1.0 / rate if rate else 0.0), time.perf_counter()
    while stop is None or not stop.is_set():
        decode_jpeg(batch, mode=ImageReadMode.RGB, device="cuda")
        torch.cuda.current_stream().synchronize()
        t_next += period
        time.sleep(max(0.0, t_next - time.perf_counter()))


class DecodeThread:
    """An iterable of the synthetic batch while a thread decodes at `rate` batches/s beside it."""

    def __init__(self, syn, jpeg_cache: Path, bs: int, rate: float) -> None:
        self.syn, self.stop = syn, threading.Event()
        batch = encoded_batch(jpeg_cache, bs)
        self.thread = threading.Thread(target=self._run, args=(batch, rate), daemon=True)
        self.thread.start()

    def _run(self, batch, rate):
        with torch.cuda.stream(torch.cuda.Stream()):
            decode_forever(batch, rate, self.stop)

    def __iter__(self):
        return iter(self.syn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


class DecodeProcess(DecodeThread):
    """The same decoding in a child process (python benchmarks/host_probe.py --decode-child ...)."""

    def __init__(self, syn, jpeg_cache: Path, bs: int, rate: float) -> None:
        self.syn = syn
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("host_probe.py")),
                                      "--decode-child", str(jpeg_cache), "--batch-size", str(bs),
                                      "--rate", str(rate)])
        time.sleep(8.0)   # CUDA context + nvJPEG start before the timed loop

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()


class Tweaked:
    """A loader run with the GIL switch interval at `switch` seconds, its GPU thread `ahead` batches
    ahead and/or its decode pool cutting a batch into `tasks` tasks; the switch interval restored on
    close, and the GPU thread's and read-wait timings printed."""

    def __init__(self, loader, switch: float | None = None, ahead: int | None = None,
                 tasks: int | None = None) -> None:
        self.loader, self.old = loader, sys.getswitchinterval()
        if tasks is not None:       # the decode pool's tasks a batch
            loader.backend._procs.per_batch = tasks
        if switch is not None:
            sys.setswitchinterval(switch)
        if ahead is not None:
            loader.backend.stage_ahead = ahead
        self.times: dict[str, list[float]] = {}
        for name in ("read", "_prepare", "_decode", "_augment", "_hold", "finish"):  # wall ms a call, printed on close
            self._time(loader.backend, name)
        waits, waited = self.times.setdefault("read wait", []), loader.backend.waited

        def count_wait(seconds: float) -> None:     # the training thread's wait for each read (the steer's signal)
            waits.append(seconds * 1e3)
            waited(seconds)
        loader.backend.waited = count_wait

    def _time(self, obj, name: str) -> None:
        fn, got = getattr(obj, name), self.times.setdefault(name, [])

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                got.append((time.perf_counter() - t0) * 1e3)
        setattr(obj, name, timed)

    def __iter__(self):
        return iter(self.loader)

    def stats(self) -> dict:
        """Table columns (warm-up batches included): the mean wait for a read a batch, the batches that
        waited at all, the CPU share now."""
        waits = np.asarray(self.times["read wait"] or [0.0])
        return {"read wait ms": float(waits.mean()), "late %": float(100 * (waits > 0).mean()),
                "cpu share %": float(100 * self.loader.backend._share)}

    def close(self) -> None:
        sys.setswitchinterval(self.old)
        self.loader.close()
        backend = self.loader.backend
        steer = getattr(backend, "_steer", None)
        share = f"CPU share at close {backend._share:.2f}" + (f" ({steer.changes} steered changes)" if steer else "")
        print(f"decoder: {backend.hardware}; images decoded {backend.decoded}; {share}. ms per batch (median, "
              "p90, mean): " + ", ".join(f"{k} {np.median(v):.2f} {np.percentile(v, 90):.2f} {np.mean(v):.2f}"
                                   for k, v in self.times.items() if v), flush=True)


class Niced(Tweaked):
    """A loader made while decode_pool.DECODE_NICE is `nice` (read when its pool is made), restored after."""

    def __init__(self, make, nice: int) -> None:
        from fastdata.read.backends import decode_pool

        was, decode_pool.DECODE_NICE = decode_pool.DECODE_NICE, nice
        try:
            loader = make()
        finally:
            decode_pool.DECODE_NICE = was
        super().__init__(loader)


def _transposed(data, h: int, w: int, out) -> None:
    """The decode processes' writer before cpu_share.planes_at_size: an HWC array, then a transposing copy."""
    from fastdata.read.backends.cpu_share import rgb_at_size

    out.reshape(3, h, w)[...] = rgb_at_size(data, h, w).transpose(2, 0, 1)


class CopiedIn(Tweaked):
    """The read path of session 6's final tree: a batch's spans walked shard by shard, the CPU share's JPEG
    bytes copied into the slot by the reader (pool_overhead.set_read_path, until close), and the decode
    processes (forked while the old writer is patched in) writing planes by a transposing copy."""

    def __init__(self, make) -> None:
        from fastdata.read.backends import decode_worker

        writer, decode_worker.planes_at_size = decode_worker.planes_at_size, _transposed
        try:
            loader = make()
        finally:
            decode_worker.planes_at_size = writer
        set_read_path(loader.backend.encoded, False)
        super().__init__(loader)

    def close(self) -> None:
        super().close()
        set_read_path(None, True)


class PilShare(Tweaked):
    """A loader whose CPU share is decoded by PIL instead of torchvision (cpu_share.DECODER), restored on close."""

    def __init__(self, make) -> None:
        from fastdata.read.backends import cpu_share

        self.module, self.was, cpu_share.DECODER = cpu_share, cpu_share.DECODER, "pil"
        super().__init__(make())

    def close(self) -> None:
        self.module.DECODER = self.was
        super().close()


class Patched(Tweaked):
    """A loader made while the lanes' stream priority and/or our binding's nvJPEG backend (nvjpeg.h:
    3 hardware, 2 GPU Huffman) are patched; both restored once it is made (they are read at creation)."""

    def __init__(self, jpeg, priority: int | None = None, nvjpeg_backend: int | None = None, **kw) -> None:
        from fastdata.cache import hw_decode
        from fastdata.read.backends import nvjpeg

        old = nvjpeg.LANE_PRIORITY, hw_decode._BACKEND_HARDWARE
        nvjpeg.LANE_PRIORITY = old[0] if priority is None else priority
        hw_decode._BACKEND_HARDWARE = old[1] if nvjpeg_backend is None else nvjpeg_backend
        try:
            loader = jpeg(**kw)
            for _ in range(kw.get("lanes", 1) - 1):   # every lane's handle now, while patched
                loader.backend._spare.append(loader.backend._new_lane())
        finally:
            nvjpeg.LANE_PRIORITY, hw_decode._BACKEND_HARDWARE = old
        super().__init__(loader)


def child(jpeg_cache: str, bs: int, rate: float) -> None:
    decode_forever(encoded_batch(Path(jpeg_cache), bs), rate)


def lead_variants(syn, default, gpu_only) -> list:
    """Rows bounding the host's lead over the GPU (max_inflight_batches, _lead.py), with the GIL sampler."""
    from _lead import Fenced, GilSampled
    from models import forever

    return [
        ("synthetic bf16 batch, GIL sampled", lambda: GilSampled(forever(syn), "synthetic"), None),
        *[(f"synthetic bf16 batch, {k} batches in flight (fenced)", lambda k=k: Fenced(forever(syn), k), None)
          for k in (2, 3)],
        ("synthetic bf16 batch, 2 batches in flight, GIL sampled",
         lambda: GilSampled(Fenced(forever(syn), 2), "synthetic, 2 in flight"), None),
        ("jpeg nvjpeg loader, default options, GIL sampled", lambda: GilSampled(Tweaked(default()), "default"), None),
        *[(f"jpeg nvjpeg loader, default options, max_inflight_batches={k}"
           + {0: " (unbounded: before)", 3: " (= default since 2026-12-07)"}.get(k, ""),
           lambda k=k: Tweaked(default(max_inflight_batches=k)), None) for k in (0, 1, 2, 3)],
        ("jpeg nvjpeg loader, default options, max_inflight_batches=2, GIL sampled",
         lambda: GilSampled(Tweaked(default(max_inflight_batches=2)), "default, 2 in flight"), None),
        ("jpeg nvjpeg loader, GPU only (cpu_share=0), max_inflight_batches=2",
         lambda: gpu_only(max_inflight_batches=2), None),
    ]


def variants(fd, syn, jpeg_cache: Path, bs: int, rate: float) -> list:
    """(name, make, images_of) rows for host_probe.main; fd(**kw) makes a fastdata.loader."""
    def jpeg(**kw):     # the GPU decodes every image unless a row gives a CPU share (in threads unless processes)
        return fd(cache=jpeg_cache, backend="nvjpeg", **{"cpu_share": 0.0, "cpu_processes": 0, **kw})

    def default(**kw):
        return fd(cache=jpeg_cache, backend="nvjpeg", **kw)

    return [
        ("synthetic bf16 batch", lambda: __import__("models").forever(syn), None),
        ("jpeg nvjpeg loader, default options (cpu share and processes picked from the CPUs)",
         lambda: Tweaked(default()), None),
        ("jpeg nvjpeg loader, default options but prefetch=16 (8 threads)",
         lambda: Tweaked(default(prefetch=16)), None),
        ("jpeg nvjpeg loader, default options but threads=12 (prefetch 12)",
         lambda: Tweaked(default(threads=12)), None),
        ("jpeg nvjpeg loader, default options, spans walked by shard, JPEGs copied, planes transposed (session 6)",
         lambda: CopiedIn(default), None),
        ("jpeg nvjpeg loader, default options, max_inflight_batches=2, read as in (session 6)",
         lambda: CopiedIn(lambda: default(max_inflight_batches=2)), None),
        *lead_variants(syn, default, lambda **kw: Tweaked(jpeg(**kw))),
        ("jpeg nvjpeg loader, default options but one task a process",
         lambda: Tweaked(fd(cache=jpeg_cache, backend="nvjpeg"), tasks=12), None),
        ("jpeg nvjpeg loader, default options but decode processes at nice 0 (before)",
         lambda: Niced(lambda: fd(cache=jpeg_cache, backend="nvjpeg"), 0), None),
        ("jpeg nvjpeg loader, NVJPG engines (hardware=True)", lambda: Tweaked(jpeg(hardware=True)), None),
        ("jpeg nvjpeg loader, fixed share 1.0 (cpu_share=1.0: not steered), default processes",
         lambda: Tweaked(fd(cache=jpeg_cache, backend="nvjpeg", cpu_share=1.0)), None),
        ("jpeg nvjpeg loader, fixed share 1.0 in 8 processes (cpu_processes=8)",
         lambda: Tweaked(fd(cache=jpeg_cache, backend="nvjpeg", cpu_share=1.0, cpu_processes=8)), None),
        ("jpeg dali loader, its own defaults (backend='dali' only: 4 threads, 1 pipeline)",
         lambda: fd(cache=jpeg_cache, backend="dali", threads=None), None),
        ("jpeg dali loader, 1 pipeline, 16 threads", lambda: fd(cache=jpeg_cache, backend="dali", threads=16), None),
        ("jpeg dali loader, 2 pipelines, 16 threads",
         lambda: fd(cache=jpeg_cache, backend="dali", threads=16, pipelines=2), None),
        ("jpeg dali loader, 3 pipelines, 15 threads",
         lambda: fd(cache=jpeg_cache, backend="dali", threads=15, pipelines=3), None),
        ("jpeg dali loader, 2 pipelines, 16 threads, hw decoder 0.65",
         lambda: fd(cache=jpeg_cache, backend="dali", threads=16, pipelines=2, hw_decoder_load=0.65), None),
        *decoder_variants(fd, syn, jpeg, jpeg_cache, bs, rate),
    ]


def decoder_variants(fd, syn, jpeg, jpeg_cache: Path, bs: int, rate: float) -> list:
    """Rows setting the GPU decoders, lanes, priorities and CPU shares against each other; jpeg(**kw)
    makes a loader whose GPU decodes every image unless a row gives a share."""
    return [
        ("jpeg nvjpeg loader, torchvision decode_jpeg (hardware=False)", lambda: Tweaked(jpeg(hardware=False)), None),
        ("jpeg nvjpeg loader, engines, pinned bytes (pinned=True)",
         lambda: Tweaked(jpeg(hardware=True, pinned=True)), None),
        ("jpeg nvjpeg loader, torchvision, pinned bytes (pinned=True)",
         lambda: Tweaked(jpeg(hardware=False, pinned=True)), None),
        ("jpeg nvjpeg loader, engines, 2 lanes, pinned bytes (pinned=True)",
         lambda: Tweaked(jpeg(hardware=True, lanes=2, pinned=True)), None),
        ("jpeg nvjpeg loader, engines, cpu share 0.3 (cpu_share=0.3)",
         lambda: Tweaked(jpeg(hardware=True, cpu_share=0.3)), None),
        ("jpeg nvjpeg loader, engines, cpu share 0.5", lambda: Tweaked(jpeg(hardware=True, cpu_share=0.5)), None),
        ("jpeg nvjpeg loader, engines, cpu share 0.5, 14 threads",
         lambda: Tweaked(jpeg(hardware=True, cpu_share=0.5, threads=14)), None),
        ("jpeg nvjpeg loader, engines, 2 lanes, pinned bytes, cpu share 0.4",
         lambda: Tweaked(jpeg(hardware=True, lanes=2, pinned=True, cpu_share=0.4)), None),
        ("jpeg nvjpeg loader, engines, cpu share 0.5 by PIL",
         lambda: PilShare(lambda: jpeg(hardware=True, cpu_share=0.5)), None),
        ("jpeg nvjpeg loader, torchvision, cpu share 0.5", lambda: Tweaked(jpeg(hardware=False, cpu_share=0.5)), None),
        ("jpeg nvjpeg loader, cpu share 1.0, 10 threads", lambda: Tweaked(jpeg(hardware=True, cpu_share=1.0, threads=10)),
         None),
        ("jpeg nvjpeg loader, cpu share 1.0 (every image on the CPU, cropped on the GPU), 14 threads",
         lambda: Tweaked(jpeg(hardware=True, cpu_share=1.0, threads=14)), None),
        ("jpeg nvjpeg loader, torchvision, cpu share 0.3 in 12 processes",
         lambda: Tweaked(jpeg(hardware=False, cpu_share=0.3, cpu_processes=12)), None),
        ("jpeg nvjpeg loader, torchvision, cpu share 0.5 in 12 processes",
         lambda: Tweaked(jpeg(hardware=False, cpu_share=0.5, cpu_processes=12)), None),
        ("jpeg nvjpeg loader, torchvision, cpu share 0.7 in 12 processes",
         lambda: Tweaked(jpeg(hardware=False, cpu_share=0.7, cpu_processes=12)), None),
        ("jpeg nvjpeg loader, cpu share 1.0 in 12 processes",
         lambda: Tweaked(jpeg(hardware=False, cpu_share=1.0, cpu_processes=12)), None),
        ("jpeg nvjpeg loader, engines, cpu share 0.5 in 12 processes",
         lambda: Tweaked(jpeg(hardware=True, cpu_share=0.5, cpu_processes=12)), None),
        ("jpeg nvjpeg loader, torchvision, cpu share 0.5 in 8 processes",
         lambda: Tweaked(jpeg(hardware=False, cpu_share=0.5, cpu_processes=8)), None),
        ("jpeg nvjpeg loader, engines, batches discarded (synthetic x)", lambda: jpeg(hardware=True), lambda b: syn.x),
        ("jpeg nvjpeg loader, torchvision, batches discarded (synthetic x)", lambda: jpeg(hardware=False),
         lambda b: syn.x),
        ("jpeg nvjpeg loader, engines, 2 lanes", lambda: Tweaked(jpeg(hardware=True, lanes=2)), None),
        ("jpeg nvjpeg loader, engines, 4 lanes", lambda: Tweaked(jpeg(hardware=True, lanes=4)), None),
        ("jpeg nvjpeg loader, torchvision, 2 lanes", lambda: Tweaked(jpeg(hardware=False, lanes=2)), None),
        ("jpeg nvjpeg loader, engines, 4 lanes, batches discarded (synthetic x)",
         lambda: jpeg(hardware=True, lanes=4), lambda b: syn.x),
        ("jpeg nvjpeg loader, engines, high priority", lambda: Patched(jpeg, priority=-1, hardware=True), None),
        ("jpeg nvjpeg loader, engines, 2 lanes, high priority",
         lambda: Patched(jpeg, priority=-1, hardware=True, lanes=2), None),
        ("jpeg nvjpeg loader, GPU Huffman (ours), 2 lanes, high priority",
         lambda: Patched(jpeg, priority=-1, nvjpeg_backend=2, hardware=True, lanes=2), None),
        ("jpeg nvjpeg loader, GPU Huffman (ours), 1 lane", lambda: Patched(jpeg, nvjpeg_backend=2, hardware=True), None),
        ("jpeg nvjpeg loader, CPU Huffman (ours, nvJPEG hybrid backend), 2 lanes",
         lambda: Patched(jpeg, nvjpeg_backend=1, hardware=True, lanes=2), None),
        ("jpeg nvjpeg loader, torchvision, high priority", lambda: Patched(jpeg, priority=-1, hardware=False), None),
        ("jpeg nvjpeg loader, engines, 4 reader threads", lambda: Tweaked(jpeg(hardware=True, threads=4)), None),
        (f"synthetic + nvJPEG decode in a thread, {rate:.0f} batches/s", lambda: DecodeThread(syn, jpeg_cache, bs, rate),
         None),
    ]
