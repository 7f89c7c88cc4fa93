"""Backend nvjpeg: JPEG decode on the GPU with torchvision.io.decode_jpeg, for machines without DALI.

    reader threads:  encoded bytes (files or cache samples)
    one GPU thread:  on its own CUDA stream: nvJPEG decodes the batch in one call, then crop, resize,
                     flip and normalise; records an event
    training thread: waits for that event on its stream (no host sync)

so the training thread launches none of the decode work; the GPU thread
works up to two batches ahead (stage_ahead).

The crop is one Triton kernel (augment_triton.py, planar mode) that reads every
image where nvJPEG left it: the plan holds each image's byte offset from the
lowest-addressed one, so no copy packs the batch first. It runs whenever some crop of
the batch shrinks less than 2x (a JPEG cache at about the output size), which is when
gpu_resize.py would not box-filter either; otherwise that packed path runs.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ...errors import DependencyError, LoaderError
from ..augment import apply_plan, normalize, plan_tensor, resolve_kernel
from ..crop import plan_rows
from ..crop_box import crop_boxes
from ..encoded import EncodedSource
from . import BaseBackend
from .decode import batch_rng, read_encoded, source_attrs
from .gpu_resize import crop_resize, pack


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
        self._stream = torch.cuda.Stream(device)
        self._gpu = ThreadPoolExecutor(1, thread_name_prefix="fastdata-gpu-decode")
        self._held: deque = deque()   # (event, decoded images) until the kernel reading them has run
        self._triton = resolve_kernel(cfg.augment, device) == "triton"

    def read(self, key, idx: np.ndarray, _slot):
        rng = batch_rng(self.cfg.seed, key, self.cfg.batch_size)
        return (*read_encoded(self.encoded, idx, self.cfg.augment, rng), rng, idx)

    def _decode(self, encoded, idx) -> list[torch.Tensor]:
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            return decode_jpeg([torch.from_numpy(e) for e in encoded], mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError as e:
            raise LoaderError(f"nvJPEG could not decode a sample of batch {idx[:4].tolist()}...: {e}; "
                              f"run `fastdata build-cache` to quarantine bad files first") from e

    def _augment(self, decoded: list[torch.Tensor], rng, flips) -> torch.Tensor:
        """The batch at cfg.size, normalised, channels_last: in place by one kernel when it can."""
        aug = self.cfg.augment
        h = np.array([im.shape[1] for im in decoded], dtype=np.int64)
        w = np.array([im.shape[2] for im in decoded], dtype=np.int64)
        boxes = crop_boxes(h, w, aug, rng)
        if self._triton and boxes[:, 2:].min() < 2 * aug.size:
            ptrs = np.array([im.data_ptr() for im in decoded], dtype=np.int64)
            first = int(ptrs.argmin())
            plan = plan_rows(boxes, flips.numpy(), aug.size, (ptrs - ptrs[first]).astype(np.float64), h, w)
            return apply_plan(decoded[first], plan_tensor(plan, self.device), aug, planar=True)
        packed, sizes = pack(decoded)
        return normalize(crop_resize(packed, sizes, torch.from_numpy(boxes), aug.size, flips), aug, layout="NCHW")

    def _prepare(self, out):
        """GPU thread, own stream: the finished batch and the event that marks it ready."""
        encoded, labels, flips, rng, idx = out
        with torch.cuda.stream(self._stream):
            decoded = self._decode(encoded, idx)
            images = self._augment(decoded, rng, flips)
            labels = labels.to(self.device)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        self._hold(ready, decoded)
        return images, labels, ready

    def _hold(self, ready, decoded) -> None:
        """Keep a batch's decoded images until the kernel that reads them has run: nvJPEG writes the
        next batches on its own stream, which does not wait for ours, into memory freed to the
        allocator (a host wait here, on the GPU thread, never on the training thread)."""
        self._held.append((ready, decoded))
        while len(self._held) > self.stage_ahead + 1:
            self._held.popleft()[0].synchronize()

    def stage(self, _slot, out, _n):
        return self._gpu.submit(self._prepare, out)

    def finish(self, staged, _idx):
        images, labels, ready = staged.result()
        main = torch.cuda.current_stream(self.device)
        main.wait_event(ready)               # GPU-side wait for the decode stream: no host sync
        images.record_stream(main)
        labels.record_stream(main)
        return images, labels

    def close(self) -> None:
        self._gpu.shutdown(wait=True)
