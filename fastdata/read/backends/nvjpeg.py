"""Backend nvjpeg: JPEG decode on the GPU with torchvision.io.decode_jpeg, for machines without DALI.

    reader threads:  encoded bytes (files or cache samples)
    one GPU thread:  on its own CUDA stream: nvJPEG decodes the batch in one call, then one packed
                     crop-resize (gpu_resize.py), flip and normalise; records an event
    training thread: waits for that event on its stream (no host sync)

so the training thread launches none of the decode work; the GPU thread
works up to two batches ahead (stage_ahead).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ...errors import DependencyError, LoaderError
from ..augment import normalize
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

    def read(self, key, idx: np.ndarray, _slot):
        rng = batch_rng(self.cfg.seed, key, self.cfg.batch_size)
        return (*read_encoded(self.encoded, idx, self.cfg.augment, rng), rng, idx)

    def _decode(self, encoded, rng, idx, flips) -> torch.Tensor:
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            decoded = decode_jpeg([torch.from_numpy(e) for e in encoded], mode=ImageReadMode.RGB, device=self.device)
        except RuntimeError as e:
            raise LoaderError(f"nvJPEG could not decode a sample of batch {idx[:4].tolist()}...: {e}; "
                              f"run `fastdata build-cache` to quarantine bad files first") from e
        boxes = torch.from_numpy(crop_boxes([im.shape[1] for im in decoded], [im.shape[2] for im in decoded],
                                            self.cfg.augment, rng))
        packed, sizes = pack(decoded)
        return crop_resize(packed, sizes, boxes, self.cfg.augment.size, flips)

    def _prepare(self, out):
        """GPU thread, own stream: the finished batch and the event that marks it ready."""
        encoded, labels, flips, rng, idx = out
        with torch.cuda.stream(self._stream):
            images = normalize(self._decode(encoded, rng, idx, flips), self.cfg.augment, layout="NCHW")
            labels = labels.to(self.device)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return images, labels, ready

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
