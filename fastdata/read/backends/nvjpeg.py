"""Backend nvjpeg: JPEG decode on the GPU without DALI, on the NVJPG engines where it can, with a share
of each batch decoded by CPU processes (on by default for a JPEG cache: decode_pool.resolve_share picks
it, share_steer.py keeps it at the most the processes sustain at the model's pace).

    reader threads:  encoded bytes (files, or spans of cache shards: spans.py) packed into a pinned
                     slot (options.pinned), and each baseline JPEG's size; the last options.cpu_share
                     of the batch decoded by the decode processes into a page-locked slot
                     (decode_pool.py, host_pin.py), or here where cpu_processes=0 (cpu_share.py)
    GPU thread(s):   options.lanes of them, each on its own CUDA stream, batches in turn: nvJPEG
                     decodes the batch in one call, then crop, resize, flip and normalise; records an event
    training thread: waits for that event on its stream (no host sync)

so the training thread launches none of the decode work; the GPU threads
work up to lanes + 1 (at least two) batches ahead (stage_ahead).

Which decoder: with options.hardware (opt-in until measured on a GPU), a batch of baseline
3-component JPEGs goes to our own call of nvJPEG's hardware backend (hw_decode.py: queued on our
stream, no host sync per call) where the engines open (A100, H100, H200); any other batch, other
GPUs, a batch the engines refuse, or hardware off: torchvision's decode_jpeg (which uses the same
engines where it can, but waits for each call to finish). `decoded` counts the images each decoded.

The crop is one Triton kernel (augment_triton.py, planar mode) that reads every
image where nvJPEG left it: the plan holds each image's byte offset from the
lowest-addressed one, so no copy packs the batch first. It runs whenever some crop of
the batch shrinks less than 2x (a JPEG cache at about the output size), which is when
gpu_resize.py would not box-filter either; otherwise that packed path runs.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import torch

from ...errors import DependencyError, LoaderError
from ...cache.gpu_build import upright
from ...cache.jpeg_header import baseline_size, jpeg_scan
from ..augment import apply_plan, normalize, plan_tensor, resolve_kernel, to_device
from ..crop import plan_rows
from ..crop_box import crop_boxes
from ..encoded import EncodedSource
from ...cache.hw_decode import HardwareDecodeError, Planes, open_hardware_decoder
from ..spans import EncodedBatch
from . import BaseBackend
from .cpu_share import cpu_count, decode_cpu, upload_planar
from .decode_pool import DecodePool, Slot, SlotSpaceError, resolve_share
from .share_steer import ShareSteer
from .decode import batch_rng, draw_flips, source_attrs
from .gpu_resize import crop_resize, pack, pack_spans


log = logging.getLogger("fastdata.read")

# CUDA priority of the lanes' streams (lower is higher; 0 is the training stream's). Measured in
# benchmarks/host_probe.py --jpeg ("priority" rows)
LANE_PRIORITY = 0


def exif_turns(scans) -> np.ndarray | None:
    """Reader thread: each JPEG's EXIF orientation (1..8) from its jpeg_scan, or None when every image
    is upright. nvJPEG ignores it, so photos from a camera held sideways came out sideways where pil and
    DALI turn them."""
    turns = np.array([(s or (0, 0, 0, 0, 0, 1))[5] for s in scans], dtype=np.int64)
    return turns if (turns != 1).any() else None


def mean_pixels(source: EncodedSource) -> float | None:
    """A JPEG cache's mean pixels an image, from its first shard's headers (walked once: shard_sizes); None
    for JPEG files, or a shard with no baseline image, which resolve_share leaves to the GPU."""
    if source.kind != "cache-jpeg" or not source.shard_counts or not source.shard_counts[0]:
        return None
    hw = source.shard_sizes(0)
    ok = hw[:, 0] > 0
    return float((hw[ok, 0] * hw[ok, 1]).mean()) if ok.any() else None


class NvjpegBackend(BaseBackend):
    kind = "nvjpeg"
    stage_ahead = 2        # the GPU thread decodes two batches ahead, as the wave-1 DecodeLoader did

    def __init__(self, source: EncodedSource, cfg, device: torch.device) -> None:
        try:
            import torchvision.io  # noqa: F401
        except Exception as e:  # noqa: BLE001 - missing or broken beside this torch
            raise DependencyError(f"backend nvjpeg needs torchvision with CUDA ({e}); pip install "
                                  f"'fastdata[dali]' for DALI instead, or use backend pil") from None
        if device.type != "cuda":
            raise LoaderError("backend nvjpeg needs a CUDA GPU; use backend pil here")
        source_attrs(self, source, "nvjpeg")
        self.cfg, self.device = cfg, device
        lanes = cfg.options.lanes
        self.stage_ahead = max(2, lanes + 1)    # two ahead with one lane (the wave-1 DecodeLoader); one more per lane
        self._gpu = ThreadPoolExecutor(lanes, thread_name_prefix="fastdata-gpu-decode")
        self._lane, self._lanes, self._lock = threading.local(), [], threading.Lock()
        self._triton = resolve_kernel(cfg.augment, device) == "triton"
        self.hardware = "nvJPEG hardware backend" if cfg.options.hardware else "off (options.hardware=False)"
        self.decoded = {"hardware": 0, "torchvision": 0, "cpu": 0}
        pixels = mean_pixels(source) if cfg.options.cpu_share is None else None   # (a header walk: only to pick)
        self._share, procs = resolve_share(cfg.options.cpu_share, cfg.options.cpu_processes, pixels)
        if self._share and cfg.prefetch is None:    # every reader thread a batch to decode (config.read_ahead)
            self.cfg = cfg = replace(cfg, prefetch=max(cfg.read_ahead, cfg.reader_threads))
        self._slots: list[Slot] = []
        # forked here, before the lanes' and readers' threads start (decode_pool.py says why)
        self._procs = DecodePool(procs, cfg.reader_threads) if self._share and procs else None
        # a share picked here follows the model's pace (share_steer.py); one the user gave stays
        self._steer = (ShareSteer(self._share, settle=cfg.read_ahead + self.stage_ahead + 1)
                       if self._procs is not None and cfg.options.cpu_share is None else None)
        log.info("nvjpeg: %.0f%% of each batch decoded on the CPU%s", 100 * self._share,
                 f" in {procs} processes" if self._procs else " in the reader threads" if self._share else "")
        self._spare = [self._new_lane()]    # the first lane now: a GPU without engines says so at once
        self._engines = self._spare[0]["hw"] is not None

    def _new_lane(self) -> dict:
        """A GPU thread's stream, hardware decoder (or None) and held batches."""
        hw, why = open_hardware_decoder(self.device) if self.cfg.options.hardware else (None, self.hardware)
        lane = {"stream": torch.cuda.Stream(self.device, priority=LANE_PRIORITY), "hw": hw, "held": deque()}
        self._lanes.append(lane)
        self.hardware = why
        return lane

    def _lane_state(self) -> dict:
        """This GPU thread's lane, taken on its first batch."""
        lane = getattr(self._lane, "state", None)
        if lane is None:
            with self._lock:
                lane = self._spare.pop() if self._spare else self._new_lane()
            self._lane.state = lane
        return lane

    def ring(self, n: int) -> list[dict] | None:
        """Slots, grown as a batch needs: pinned rooms for the batches' bytes (options.pinned), shared
        ones for the decode processes (options.cpu_processes)."""
        if not (self.cfg.options.pinned or self._procs):
            return None
        slots = [{"room": None, "staged": None, "shared": Slot(self.device.index) if self._procs else None}
                 for _ in range(n)]
        self._slots += [s["shared"] for s in slots if s["shared"] is not None]
        return slots

    @staticmethod
    def _reuse(slot: dict | None) -> None:
        """Reader thread: wait until the batch that last used the slot has been decoded and cropped
        (the core reuses a slot only after that batch was finished, but its GPU work may still run)."""
        staged = slot.pop("staged", None) if slot else None
        if staged is not None and staged.exception() is None:   # (a failed one raised in finish())
            staged.result()[2].synchronize()

    def _pack(self, batch: EncodedBatch, slot: dict) -> EncodedBatch:
        """Reader thread: the batch's bytes in the slot's pinned room."""
        need = batch.nbytes()
        if slot["room"] is None or slot["room"].numel() < need:
            slot["room"] = torch.empty(need + need // 4, dtype=torch.uint8, pin_memory=True)
        return batch.packed(slot["room"].numpy())

    def read(self, key, idx: np.ndarray, slot):
        rng = batch_rng(self.cfg.seed, key, self.cfg.batch_size)
        need_sizes = self._engines or bool(self._share)
        batch = self.encoded.get_spans(idx, sizes=need_sizes)
        labels = torch.from_numpy(batch.labels)
        flips = torch.from_numpy(draw_flips(len(idx), self.cfg.augment, rng))
        if self.encoded.kind == "cache-jpeg":       # a cache is built upright: sizes only, by numpy
            sizes, turns = batch.baseline_sizes() if need_sizes else None, None
        else:
            scans = [jpeg_scan(e) for e in batch.arrays()]
            sizes, turns = self._baseline_sizes(scans), exif_turns(scans)
        self._reuse(slot)
        batch, sizes, cpu = self._split(batch, idx, sizes, turns, slot)
        if self.cfg.options.pinned:
            batch = self._pack(batch, slot)
        return batch, labels, flips, rng, idx, sizes, turns, cpu

    def _split(self, batch: EncodedBatch, idx, sizes, turns, slot=None):
        """Reader thread: (the GPU's part, its sizes, the CPU's part decoded or None): the last
        options.cpu_share of a batch whose sizes are known and whose images are upright, decoded by
        the decode processes into the slot where there are some, else here."""
        k = cpu_count(self._share, len(batch)) if sizes is not None and turns is None else 0
        if k == 0:
            return batch, sizes, None
        m = len(batch) - k
        h, w = sizes
        name_of = lambda j: self.encoded.name(int(idx[m + j]))  # noqa: E731
        if self._procs is not None:
            try:
                flat = self._procs.decode(slot["shared"], batch.take(m, len(batch)), h[m:], w[m:], name_of)
            except SlotSpaceError as e:
                if self.cfg.options.cpu_share is not None:   # asked for: the user's to fix
                    raise
                log.warning("%s; the GPU decodes every image from now on", e)
                self._share, self._steer = 0.0, None         # picked by default: the GPU decodes it all
                return batch, sizes, None
            pixels, planar = torch.from_numpy(flat), True
        else:
            pixels, planar = decode_cpu(batch.take(m, len(batch)).arrays(), h[m:], w[m:], name_of, pin=True)
        self._count("cpu", k)
        return batch.take(0, m), (h[:m], w[:m]), (pixels, h[m:], w[m:], planar)

    def _baseline_sizes(self, scans) -> tuple[np.ndarray, np.ndarray] | None:
        """Reader thread: (heights, widths) when the engines (or the CPU's share) can take every image."""
        if not self._engines and not self._share:
            return None
        sizes = [baseline_size(scan=s) for s in scans]
        if not sizes or any(s is None for s in sizes):
            return None
        hw = np.array(sizes, dtype=np.int64)
        return hw[:, 0], hw[:, 1]

    def waited(self, seconds: float) -> None:
        if self._steer is not None:
            self._share = self._steer.observe(seconds)

    def _count(self, which: str, n: int) -> None:
        with self._lock:
            self.decoded[which] += n

    def _decode(self, batch: EncodedBatch, idx, sizes, lane) -> Planes:
        if sizes is not None and lane["hw"] is not None:
            try:
                decoded = lane["hw"].decode(*batch.pointers(), *sizes, lane["stream"])
                self._count("hardware", len(batch))
                return decoded
            except HardwareDecodeError:
                pass            # the engines refused this batch: torchvision decodes it (and names a bad file)
        from torchvision.io import ImageReadMode, decode_jpeg

        self._count("torchvision", len(batch))
        encoded = batch.arrays()
        try:
            return Planes.of_images(decode_jpeg([torch.from_numpy(e) for e in encoded], mode=ImageReadMode.RGB,
                                                device=self.device))
        except torch.OutOfMemoryError as e:   # not a bad file: "quarantine bad files" would mislead
            raise LoaderError(f"the GPU ran out of memory decoding a batch of {len(encoded)} JPEGs "
                              f"({str(e).splitlines()[0][:120]}); lower batch_size, or build a cache at the "
                              f"training size (`fastdata build-cache --encode jpeg`) so each image is small") from e
        except RuntimeError as e:
            raise LoaderError(f"nvJPEG could not decode a sample of batch {idx[:4].tolist()}...: {e}; "
                              f"run `fastdata build-cache` to quarantine bad files first") from e

    def _augment(self, planes: Planes, rng, flips) -> torch.Tensor:
        """The batch at cfg.size, normalised, channels_last: in place by one kernel when it can."""
        aug = self.cfg.augment
        h, w = planes.heights, planes.widths
        boxes = crop_boxes(h, w, aug, rng)
        if self._triton and boxes[:, 2:].min() < 2 * aug.size:
            plan = plan_rows(boxes, flips.numpy(), aug.size, planes.offsets.astype(np.float64), h, w)
            return apply_plan(planes.base, plan_tensor(plan, self.device), aug, planar=True)
        decoded, boxes = planes.images(), torch.from_numpy(boxes)
        parts = [crop_resize(*pack(decoded[lo:hi]), boxes[lo:hi], aug.size, None if flips is None else flips[lo:hi])
                 for lo, hi in pack_spans([im.shape[1] * im.shape[2] for im in decoded])]
        return normalize(parts[0] if len(parts) == 1 else torch.cat(parts), aug, layout="NCHW")

    def _prepare(self, out):
        """GPU thread, own stream: the finished batch and the event that marks it ready."""
        encoded, labels, flips, rng, idx, sizes, turns, cpu = out
        lane = self._lane_state()
        with torch.cuda.stream(lane["stream"]):
            raw = decoded = self._decode(encoded, idx, sizes, lane) if len(encoded) else None
            if turns is not None:   # phone photos: turned as PIL and DALI turn them, then contiguous
                decoded = Planes.of_images([upright(x, int(t)).contiguous() if t != 1 else x
                                            for x, t in zip(raw.images(), turns)])
            if cpu is not None:     # the CPU's share (cpu_share.py), after the GPU's images
                pixels, heights, widths, planar = cpu
                mine = upload_planar(pixels, heights, widths, self.device, planar)
                decoded = mine if raw is None else Planes.joined(raw, mine)
            images = self._augment(decoded, rng, flips)
            labels = to_device(labels, self.device)     # pinned: no wait for this batch's decode
            ready = torch.cuda.Event()
            ready.record(lane["stream"])
        self._hold(lane["held"], ready, (raw, decoded, encoded))   # raw too: the turning copies read it on our stream
        return images, labels, ready

    def _hold(self, held: deque, ready, kept) -> None:
        """Keep a batch's decoded images until the kernel that reads them has run: nvJPEG writes the
        next batches on its own stream, which does not wait for ours, into memory freed to the
        allocator (a host wait here, on the GPU thread, never on the training thread). The encoded
        bytes are kept as long: the hardware backend may read them after its call returns."""
        held.append((ready, kept))
        while len(held) > self.stage_ahead + 1:
            held.popleft()[0].synchronize()

    def stage(self, slot, out, _n):
        staged = self._gpu.submit(self._prepare, out)
        if slot:
            slot["staged"] = staged
        return staged

    def finish(self, staged, _idx):
        images, labels, ready = staged.result()
        main = torch.cuda.current_stream(self.device)
        main.wait_event(ready)               # GPU-side wait for the decode stream: no host sync
        images.record_stream(main)
        labels.record_stream(main)
        return images, labels

    def close(self) -> None:
        self._gpu.shutdown(wait=True)
        for lane in self._lanes:
            lane["stream"].synchronize()    # its uploads out of the slots have run
            if lane["hw"] is not None:
                lane["hw"].close()
        self._lanes = []
        if self._steer is not None and self._steer.changes:
            log.info("nvjpeg: CPU share steered to %.2f (%d changes); images decoded %s", self._share,
                     self._steer.changes, self.decoded)
        if self._procs is not None:
            self._procs.close()
        if self._slots:
            log.info("nvjpeg: %d of %d decode slots page-locked", sum(s.pinned for s in self._slots), len(self._slots))
        for slot in self._slots:
            slot.close()
        self._slots = []
