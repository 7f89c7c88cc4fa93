"""fastdata.loader(): the fast path from a cache to augmented batches on the GPU.

Per batch::

    reader thread:  memory-mapped shard --numpy.take--> pinned uint8 slot   (GIL released)
    main thread:    pinned slot --non_blocking copy on a side stream--> GPU uint8
    main stream:    wait for the copy event --> augment (crop, flip, normalise) --> yield

Data stays uint8 until it is on the GPU (4x fewer bytes over PCIe than
float32). Slots form a ring; a reader refills a slot only after the copy out
of it has finished (it waits on that copy's event, in its own thread, so the
training loop never blocks on it). Reads run ahead across the epoch end into
the next epoch, so an epoch starts warm. On CPU the same code runs without
pinning or streams, which is what CI tests.
"""
from __future__ import annotations

import logging
import mmap
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import torch

from .._util import human_bytes, memory_budget, parse_size
from ..errors import CacheFormatError, LoaderError
from .augment import AugmentConfig, apply_plan, batch_seed
from .crop import PLAN_COLUMNS, draw_plan
from .batch import Batch, Coverage, Resumable
from .order import OrderConfig, SampleOrder, resolve_rank_world
from .reader import Cache, open_cache

log = logging.getLogger("fastdata.loader")
from .fill import shard_ids, fill_batch
from .integrity import check_mode
from .stream import Streamer, stream_window


@dataclass(frozen=True)
class LoaderConfig:
    batch_size: int
    device: str = "auto"             # auto: cuda when available, else cpu
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    augment: AugmentConfig | None = None
    threads: int = 4                 # reader threads (numpy.take / JPEG decode release the GIL)
    prefetch: int = 6                # batches being read ahead
    window: int = 16384
    read: str = "mmap"               # raw caches: mmap (one gather per shard) | pread (see fill.py)
    rank: int | None = None          # None: from torch.distributed when initialised
    world_size: int | None = None
    integrity: str = "shard"         # shard | sample | off: checks on read (data/integrity.py)
    memory: str | int | None = "auto"   # streaming reads of caches bigger than memory (stream.py): "auto"
    #                                     turns them on when the cache exceeds half the memory budget; a
    #                                     size ("8GB") forces them with that budget; None: never


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LoaderError(f"device={name!r} but CUDA is not available here; pass device='cpu'")
    return dev


def _host_images(shape) -> torch.Tensor:
    """A fresh CPU batch in its own anonymous mapping, returned to the kernel when the batch is freed.
    From malloc, tens-of-MB batches freed by the user's loop and allocated in reader threads piled up
    in glibc's per-thread arenas (685 MB of anonymous memory for a loader told to use 700 MB, which the
    cgroup then killed; benchmarks/out_of_ram.py)."""
    buf = mmap.mmap(-1, max(1, int(np.prod(shape))))
    return torch.frombuffer(buf, dtype=torch.uint8).view(shape)


class FastLoader(Resumable):
    """Iterable over Batch; one pass is one epoch. Resumable via state_dict()."""

    def __init__(self, cache: Cache, cfg: LoaderConfig) -> None:
        m = cache.manifest
        if m.kind == "bytes" or m.sample_shape is None:
            raise LoaderError(f"{cache.path}: fastdata.loader needs fixed-shape images (kind={m.kind}, shape="
                              f"{m.sample_shape}); rebuild with --encode raw|jpeg --resize fixed, "
                              f"or use fastdata.CacheDataset with a DataLoader")
        self.cache, self.cfg = cache, cfg
        self.device = _resolve_device(cfg.device)
        rank, world = resolve_rank_world(cfg.rank, cfg.world_size)
        self._streamer, window = self._streaming(cache, cfg)
        ocfg = OrderConfig(cfg.shuffle, cfg.seed, window, rank, world)
        self.order = SampleOrder([s.count for s in m.shards], cfg.batch_size, ocfg, cfg.drop_last)
        self.coverage_audit = Coverage(len(cache))
        self.source = f"cache-{m.kind}"
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._pool, self._ring, self._submitted, self._token = None, None, 0, None
        self._inflight: deque = deque()   # reads (and copies) made ahead, oldest first
        self._pass = (0, 0)               # (epoch, position) where the current pass started

    @staticmethod
    def _streaming(cache: Cache, cfg: LoaderConfig):
        """(Streamer or None, shuffle window): stream.py says when and why."""
        if cfg.memory is None or cache.url is not None:   # (object storage has its own bounded folder)
            return None, cfg.window
        budget = memory_budget() if cfg.memory == "auto" else parse_size(cfg.memory)
        total = sum(s.bytes for s in cache.manifest.shards)
        if cfg.memory == "auto" and total <= budget // 2:
            return None, cfg.window
        sample_bytes = int(np.prod(cache.sample_shape))
        budget -= (cfg.prefetch + 2) * cfg.batch_size * sample_bytes   # the batch slots live there too
        if budget < 4 * max(s.bytes for s in cache.manifest.shards):
            raise LoaderError(f"{cache.path}: a memory budget of {human_bytes(budget)} (after the batch slots) "
                              f"cannot hold 4 shards; lower batch_size/prefetch, raise memory=, or rebuild "
                              f"with a smaller --shard-size")
        window = min(cfg.window, stream_window(budget, sample_bytes, cfg.batch_size))
        log.info("%s: %s cache, memory budget %s: streaming shards, shuffle window %d samples",
                 cache.path, human_bytes(total), human_bytes(budget), window)
        return Streamer(cache, budget, lag=cfg.prefetch + 2), window

    def _slots(self, n: int) -> list[dict]:
        shape = (self.cfg.batch_size, *self.cache.sample_shape)
        pin = self.device.type == "cuda"
        plan = (self.cfg.batch_size, PLAN_COLUMNS)
        return [{"images": torch.empty(shape, dtype=torch.uint8, pin_memory=True) if pin else _host_images(shape),
                 "labels": torch.empty(self.cfg.batch_size, dtype=torch.int64, pin_memory=pin),
                 "plan": torch.empty(plan, dtype=torch.float64, pin_memory=pin),
                 "copied": None} for _ in range(n)]

    def _read(self, key, idx: np.ndarray, slot: dict) -> None:
        """Reader thread: gather the batch into its slot and draw its augmentation plan beside it, so
        the GPU side of a batch is one copy and one kernel (crop.py)."""
        fill_batch(self.cache, idx, slot, self.cfg.read)
        aug = self.cfg.augment
        if aug is not None:
            h, w = self.cache.sample_shape[:2]
            n = len(idx)
            plan = draw_plan(aug, batch_seed(self.cfg.seed, key[0], key[1] // self.cfg.batch_size),
                             np.full(n, h), np.full(n, w))
            slot["plan"][:n].copy_(torch.from_numpy(plan))

    def _to_device(self, slot: dict, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._stream is None:  # CPU: hand out fresh tensors, the slot is not reused
            return slot["images"][:n], slot["labels"][:n], slot["plan"][:n]
        with torch.cuda.stream(self._stream):
            images = slot["images"][:n].to(self.device, non_blocking=True)
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

    def _finish(self, images, labels, plan, indices) -> Batch:
        if self.cfg.augment is not None:
            images = apply_plan(images, plan, self.cfg.augment)
        return Batch(images, labels, torch.from_numpy(indices), self.source)

    # ---- reading ahead, across epoch ends -------------------------------------------------------
    def _plan(self, epoch: int, position: int):
        """(key, indices) of every batch from (epoch, position) on: the rest of this epoch, then the
        next epoch from its start, so reads never stop at an epoch end (a cold start per epoch cost
        the short benchmark epochs several percent). key = (epoch, position) names a batch exactly,
        because the order is a pure function of (seed, epoch)."""
        bs = self.cfg.batch_size
        for e in (epoch, epoch + 1):
            start = position if e == epoch else 0
            for k, idx in enumerate(self.order.epoch_batches(e, start)):
                yield (e, start + k * bs), idx

    def _drop_stale(self, key) -> None:
        """Reads made for another position (state loaded, or another epoch) are waited for and dropped:
        they write into slots that are about to be reused."""
        if self._inflight and self._inflight[0]["key"] == key:
            return
        for ent in self._inflight:
            try:
                ent["fut"].result()
            except Exception:  # noqa: BLE001 - a stale read's failure does not matter
                pass
        self._inflight.clear()

    def _submit(self, key, idx) -> None:
        idx = np.sort(idx)
        cpu = self._stream is None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.cfg.threads, thread_name_prefix="fastdata-read")
            self._ring = None if cpu else self._slots(self.cfg.prefetch + 2)
        slot = self._slots(1)[0] if cpu else self._ring[self._submitted % len(self._ring)]
        self._submitted += 1
        if self._streamer is not None and key[0] == self._pass[0]:   # (reads into the next epoch: on demand)
            self._streamer.submitted((key[1] - self._pass[1]) // self.cfg.batch_size)
        fut = self._pool.submit(self._read, key, idx, slot)
        self._inflight.append({"key": key, "idx": idx, "slot": slot, "fut": fut, "out": None})

    def _copy(self, ent, batch_no: int) -> None:
        if ent["out"] is None:
            self._wait(ent["fut"], batch_no)
            ent["out"] = self._to_device(ent["slot"], len(ent["idx"]))

    def __iter__(self):
        """One epoch. Up to `prefetch` batches are read ahead, and the next batch's copy to the GPU is
        in flight behind the batch being trained on; reads made ahead survive an early exit, a next
        epoch and a state_dict(), and are dropped after load_state_dict() to another position."""
        batches = self._epoch_batches()
        epoch, pos = self.order.epoch, self.order.position
        if self.cache.url is not None and batches:   # object storage: fetch shards in the order they are read
            self.cache.read_ahead(shard_ids(self.cache, np.concatenate(batches)))
        if self._streamer is not None:
            self._streamer.plan([shard_ids(self.cache, b) for b in batches])
        self._pass = (epoch, pos)
        token = self._token = object()
        self._drop_stale((epoch, pos))
        plan = self._plan(epoch, pos)
        for _ in range(len(self._inflight)):  # already in flight: skip them in the plan
            next(plan)
        for k in range(len(batches)):
            if self._token is not token:
                raise LoaderError(f"{self.cache.path}: another iteration of this loader started; finish or "
                                  f"drop the first iterator before starting the next")
            while len(self._inflight) <= self.cfg.prefetch:
                nxt = next(plan, None)
                if nxt is None:
                    break
                self._submit(*nxt)
            batch_no = pos // self.cfg.batch_size + k
            self._copy(self._inflight[0], batch_no)
            if len(self._inflight) > 1:
                self._copy(self._inflight[1], batch_no + 1)
            ent = self._inflight.popleft()
            yield from self._emit((ent["idx"], *ent["out"]))
        self.order.next_epoch()

    def _emit(self, item):
        idx, images, labels, plan = item
        batch = self._finish(images, labels, plan, idx)
        self._yielded(idx)
        yield batch

    def _wait(self, fut, batch_no: int) -> None:
        try:
            fut.result()
        except CacheFormatError:
            raise
        except Exception as e:  # a reader thread died: say which batch and why
            raise LoaderError(f"{self.cache.path}: reader failed on batch {batch_no} of epoch "
                              f"{self.order.epoch}: {type(e).__name__}: {e}") from e


def loader(cache, batch_size: int, *, device: str = "auto", shuffle: bool = True, seed: int = 0,
           drop_last: bool = False, augment: bool | AugmentConfig | None = None, remote=None,
           **options) -> FastLoader:
    """Stream batches from a cache folder (or open Cache) to `device`.

    augment: None/False -> uint8 NHWC batches; True -> train-time RandomResizedCrop(224) + flip +
    normalise to float32 NCHW channels_last; or an AugmentConfig. options: see LoaderConfig.
    """
    if not isinstance(cache, Cache):   # remote: stores.fetch.RemoteConfig for an s3:// cache
        cache = open_cache(cache, check_mode(options.get("integrity", "shard")), remote)
    if augment is True:
        augment = AugmentConfig()
    elif augment is False:
        augment = None
    cfg = LoaderConfig(batch_size, device, shuffle, seed, drop_last, augment, **options)
    if cfg.threads < 1 or cfg.prefetch < 1:
        raise LoaderError(f"threads={cfg.threads}, prefetch={cfg.prefetch}: both must be at least 1")
    if cfg.read not in ("mmap", "pread"):
        raise LoaderError(f"read={cfg.read!r}: choose mmap or pread")
    return FastLoader(cache, replace(cfg))
