"""What a DALI pipeline will hand out, batch by batch, across epoch boundaries.

DALI decodes ``prefetch`` batches ahead of the training step, so the loader
must know which samples each output holds before it arrives. Both ways of
giving DALI the encoded bytes draw from one plan, the read side's
SampleOrder continued from its saved (epoch, position) into later epochs:

    Feeder      our ``fn.external_source`` callable (JPEG caches, or files with
                file_reader="feed"). It reads a few batches ahead in threads and
                records each batch it hands DALI.
    files_for   DALI's own C++ ``fn.readers.file`` (image folders) takes the plan
                as its ``files`` list, unshuffled, each batch padded to the full
                batch size, so no Python runs per sample at all. A list holds
                PLAN_SAMPLES samples; then a new pipeline is built where it
                ended. On the H200 this reader made the loader 17.8-32.8k
                img/s against 11.3k through the Feeder.

Crossing epochs inside one pipeline matters: a pipeline that stops at every
epoch end drains its prefetch queue and refills it from empty, which the
training step waits for (on a 20k-image set that is every 3 s).
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Iterator

import numpy as np

from ..order import SampleOrder
from ...errors import LoaderError
from ..header import image_sizes
from .dali_crop import batch_windows
from ..encoded import EncodedSource

# samples per files list of the native reader; a new pipeline is built after them. Measured on 2 CPU
# cores: starting a pipeline over 262k files takes 0.37 s and peaks at +230 MB (1M: 1.9 s, +911 MB);
# at 6k img/s that start comes every ~40 s
PLAN_SAMPLES = 1 << 18


@dataclass(frozen=True)
class Planned:
    """One batch the pipeline will output: where it starts, its samples, and the state after it."""

    epoch: int
    position: int                 # samples of this rank's epoch handed out before this batch
    idx: np.ndarray               # global sample indices
    after: tuple[int, int]        # (epoch, position) once it is handed out


def plan(order: SampleOrder, epoch: int, position: int) -> Iterator[Planned]:
    """Every batch from (epoch, position) on, through later epochs, without moving `order`."""
    if order.batches_per_epoch() == 0:     # an empty data set; SampleOrder refuses a drop_last one
        raise LoaderError(f"{sum(order.shard_counts)} samples: nothing to decode")
    while True:
        batches = order.epoch_batches(epoch, position)
        for k, idx in enumerate(batches):
            after = (epoch + 1, 0) if k == len(batches) - 1 else (epoch, position + len(idx))
            yield Planned(epoch, position, idx, after)
            position += len(idx)
        epoch, position = epoch + 1, 0


def files_for(source: EncodedSource, planned: list[Planned], batch_size: int) -> tuple[list[str], list[int]]:
    """The native reader's files and labels: the plan's samples in order, a short batch padded with its
    last sample (the loader slices the padding off). The label DALI returns is the sample index, so
    the loader checks every output against the plan."""
    idx = np.concatenate([np.pad(p.idx, (0, batch_size - len(p.idx)), mode="edge") for p in planned])
    return [str(source.items[i].path) for i in idx.tolist()], idx.tolist()


def native_plan(order: SampleOrder, epoch: int, position: int) -> list[Planned]:
    """The batches one files list holds: about PLAN_SAMPLES samples, across epoch ends as they come
    (bounded, so that an ImageNet-sized epoch does not make one list of 1.28M files)."""
    n = max(1, PLAN_SAMPLES // order.batch_size)
    return list(islice(plan(order, epoch, position), n))


class Feeder:
    """external_source callable: the next planned batch as (encoded bytes, sample indices).

    Never raises StopIteration: the plan runs on through epochs. The bytes of the next batches are
    read ahead in threads (np.fromfile and the cache's memory copies release the GIL), so DALI's
    call into this, which runs in the training thread, only collects a finished list.
    """

    def __init__(self, source: EncodedSource, threads: int, ahead: int) -> None:
        self.source, self.ahead = source, ahead
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="fastdata-dali-read")
        self.planned: Iterator[Planned] = iter(())
        self.pending: deque = deque()
        self.fed: deque[Planned] = deque()
        self.crops: tuple | None = None

    def _read(self, p: Planned):
        encoded = self.source.get_batch(p.idx)[0]
        out = [encoded, p.idx.astype(np.int64).reshape(-1, 1)]
        if self.crops is not None:   # each sample's crop window and flip, drawn here (dali_crop.py)
            aug, seed, bs = self.crops
            shape = self.source.cache.manifest.sample_shape if self.source.cache is not None else None
            h, w = (np.full(len(p.idx), shape[0]), np.full(len(p.idx), shape[1])) if shape is not None else \
                image_sizes(encoded)
            out += batch_windows(p.idx, h, w, aug, seed, (p.epoch, p.position), bs)
        return out

    def start(self, planned: Iterator[Planned], fed: deque, crops: tuple | None = None) -> None:
        """Feed from `planned` on; each batch handed to DALI is appended to `fed`. With crops=(AugmentConfig,
        seed, batch_size), each batch also carries its crop windows and flips."""
        for _, fut in self.pending:
            fut.cancel()
        self.planned, self.fed, self.pending, self.crops = planned, fed, deque(), crops
        for p in islice(planned, self.ahead):
            self.pending.append((p, self.pool.submit(self._read, p)))

    def __call__(self):
        p, fut = self.pending.popleft()
        nxt = next(self.planned)
        self.pending.append((nxt, self.pool.submit(self._read, nxt)))
        self.fed.append(p)
        return fut.result()
