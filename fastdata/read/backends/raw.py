"""Backend raw: uint8 pixels from a raw cache, augmented on the GPU in one kernel.

Per batch::

    reader thread:  memory-mapped shard --numpy.take--> pinned uint8 slot, crop plan beside it (GIL released)
    main thread:    pinned slot --non_blocking copy on a side stream--> GPU uint8
    main stream:    wait for the copy event --> crop, flip, normalise (augment.py) --> batch

Data stays uint8 until it is on the GPU (4x fewer bytes over PCIe than
float32). A fixed-shape JPEG cache takes the same path, its samples decoded
by PIL in the reader threads into the uint8 slots (fill.py). On CPU the same code runs without pinning or streams, which is
what CI tests.
"""
from __future__ import annotations

import logging
import mmap

import numpy as np
import torch

from ..._util import human_bytes, memory_budget, parse_size
from ...errors import LoaderError
from ..augment import apply_plan, batch_seed
from ..crop import PLAN_COLUMNS, draw_plan
from ..fill import fill_batch, fill_packed, shard_ids
from ..gather import advise_mapping
from ..reader import Cache
from ..stream import Streamer, stream_window
from . import BaseBackend

log = logging.getLogger("fastdata.loader")


def _host_images(shape) -> torch.Tensor:
    """A fresh CPU batch in its own anonymous mapping, returned to the kernel when the batch is freed.
    From malloc, tens-of-MB batches freed by the user's loop and allocated in reader threads piled up
    in glibc's per-thread arenas (685 MB of anonymous memory for a loader told to use 700 MB, which the
    cgroup then killed; benchmarks/out_of_ram.py). Private, in transparent huge pages where the kernel
    allows: mmap.mmap(-1, n) is MAP_SHARED (shmem pages), whose page-by-page faults took 1.5 of the
    2-core box's cores; private huge pages made CPU batches 2.3-3.0x faster (host-batches-cpu2-2026-12-07.md)."""
    n = max(1, int(np.prod(shape)))
    buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if n >= _HUGE_PAGE:
        advise_mapping(buf, n, _MADV_HUGEPAGE)     # a hint: refused where THP is off
    return torch.frombuffer(buf, dtype=torch.uint8).view(shape)


_HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14


class RawBackend(BaseBackend):
    kind = "raw"

    def __init__(self, cache: Cache, cfg, device: torch.device) -> None:
        m = cache.manifest
        self.variable = m.kind == "raw" and m.sample_shape is None   # --resize short|max: packed slots
        if m.kind == "bytes" or (m.sample_shape is None and not self.variable):
            raise LoaderError(f"{cache.path}: backend raw reads raw caches and fixed-shape JPEG caches (this one: "
                              f"kind={m.kind}, shape={m.sample_shape}); use backend pil|nvjpeg|dali for JPEGs of "
                              f"any size, or fastdata.CacheDataset with a DataLoader for other kinds")
        if self.variable and cfg.augment is None:
            raise LoaderError(f"{cache.path}: its images have different sizes (built with --resize short|max), so "
                              f"a batch needs a crop to one size: pass augment=True or an AugmentConfig")
        self.cache, self.cfg, self.device = cache, cfg, device
        self.name, self.where = f"cache-{m.kind}", str(cache.path)
        self.shard_counts = [s.count for s in m.shards]
        self._streamer, self.window = self._streaming()
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def _streaming(self):
        """(Streamer or None, shuffle window): stream.py says when and why."""
        cache, cfg, opts = self.cache, self.cfg, self.cfg.options
        if opts.memory is None or cache.url is not None:   # (object storage has its own bounded folder)
            return None, opts.window
        budget = memory_budget() if opts.memory == "auto" else parse_size(opts.memory)
        total = sum(s.bytes for s in cache.manifest.shards)
        if opts.memory == "auto" and total <= budget // 2:
            return None, opts.window
        sample_bytes = self._sample_bytes()
        budget -= (cfg.read_ahead + 2) * cfg.batch_size * sample_bytes   # the batch slots live there too
        if budget < 4 * max(s.bytes for s in cache.manifest.shards):
            raise LoaderError(f"{cache.path}: a memory budget of {human_bytes(budget)} (after the batch slots) "
                              f"cannot hold 4 shards; lower batch_size/prefetch, raise memory=, or rebuild "
                              f"with a smaller --shard-size")
        window = min(opts.window, stream_window(budget, sample_bytes, cfg.batch_size))
        log.info("%s: %s cache, memory budget %s: streaming shards, shuffle window %d samples",
                 cache.path, human_bytes(total), human_bytes(budget), window)
        return Streamer(cache, budget, lag=cfg.read_ahead + 2), window

    def _sample_bytes(self) -> int:
        """Bytes per sample: exact for fixed shapes, the mean for variable ones."""
        m = self.cache.manifest
        if m.sample_shape is not None:
            return int(np.prod(m.sample_shape))
        return max(1, sum(s.bytes for s in m.shards) // max(1, m.num_samples))

    def _buffer(self, nbytes: int) -> torch.Tensor:
        """A flat uint8 buffer for packed variable-shape samples (pinned when copying to a GPU)."""
        if self._stream is not None:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return _host_images((nbytes,))

    def ring(self, n: int) -> list[dict] | None:
        return self._slots(n) if self._stream is not None else None   # CPU: each batch its own tensors

    def fresh_slot(self) -> dict:
        return self._slots(1)[0]

    def _slots(self, n: int) -> list[dict]:
        bs = self.cfg.batch_size
        pin = self._stream is not None
        return [{"images": self._images(bs),
                 "labels": torch.empty(bs, dtype=torch.int64, pin_memory=pin),
                 "plan": torch.empty((bs, PLAN_COLUMNS), dtype=torch.float64, pin_memory=pin),
                 "copied": None, "nbytes": 0} for _ in range(n)]

    def _images(self, bs: int) -> torch.Tensor:
        """A slot's image buffer: (bs, H, W, C), or flat room for 1.5x the mean sample when shapes vary
        (fill_packed grows a slot that needs more)."""
        if self.variable:
            return self._buffer(bs * self._sample_bytes() * 3 // 2)
        shape = (bs, *self.cache.sample_shape)
        return torch.empty(shape, dtype=torch.uint8, pin_memory=True) if self._stream is not None else \
            _host_images(shape)

    def begin(self, batches) -> None:
        if self.cache.url is not None:   # object storage: fetch shards in the order they are read
            self.cache.read_ahead(shard_ids(self.cache, np.concatenate(batches)))
        if self._streamer is not None:
            self._streamer.plan([shard_ids(self.cache, b) for b in batches])

    def submitted(self, k: int) -> None:
        if self._streamer is not None:
            self._streamer.submitted(k)

    def read(self, key, idx: np.ndarray, slot: dict) -> None:
        """Reader thread: gather the batch into its slot and draw its augmentation plan beside it, so
        the GPU side of a batch is one copy and one kernel (crop.py)."""
        aug, n = self.cfg.augment, len(idx)
        if self.variable:
            h, w, offsets = fill_packed(self.cache, idx, slot, lambda nbytes: self._buffer(nbytes * 3 // 2))
        else:
            fill_batch(self.cache, idx, slot, self.cfg.options.read)
            h, w = np.full(n, self.cache.sample_shape[0]), np.full(n, self.cache.sample_shape[1])
            offsets = None
        if aug is not None:
            plan = draw_plan(aug, batch_seed(self.cfg.seed, key[0], key[1] // self.cfg.batch_size), h, w, offsets)
            slot["plan"][:n].copy_(torch.from_numpy(plan))

    def stage(self, slot: dict, _out, n: int):
        src = slot["images"][:slot["nbytes"]] if self.variable else slot["images"][:n]
        if self._stream is None:  # CPU: hand out the slot's tensors, the slot is not reused
            return src, slot["labels"][:n], slot["plan"][:n]
        with torch.cuda.stream(self._stream):
            images = src.to(self.device, non_blocking=True)
            labels = slot["labels"][:n].to(self.device, non_blocking=True)
            plan = slot["plan"][:n].to(self.device, non_blocking=True) if self.cfg.augment else None
            copied = torch.cuda.Event()
            copied.record(self._stream)
        slot["copied"] = copied          # the reader that refills this slot waits on it
        main = torch.cuda.current_stream(self.device)
        main.wait_event(copied)          # GPU-side wait: no host sync
        for t in (images, labels, plan):
            if t is not None:
                t.record_stream(main)
        return images, labels, plan

    def finish(self, staged, _idx):
        images, labels, plan = staged
        if self.cfg.augment is not None:
            images = apply_plan(images, plan, self.cfg.augment)
        return images, labels

    def close(self) -> None:
        if self._streamer is not None:
            self._streamer.close()
