"""The one Loader: sample order, coverage, reader pool, slot ring, read-ahead, hand-off, state.

Every backend (backends/) turns sample indices into a device batch; what
they share lives here, once::

    SampleOrder --(key, indices)--> reader pool: backend.read() into a slot     (threads, GIL released)
                 main thread:        backend.stage(): start the trip to the device (side stream, async)
                 main thread:        backend.finish(): the batch, on the training stream -> Batch

* Reads run ``prefetch`` batches ahead, across the epoch end into the next
  epoch, so an epoch starts warm; the next ``backend.stage_ahead`` batches'
  stage() is in flight behind the batch being trained on.
* A batch is named by key = (epoch, position); the order is a pure function
  of (seed, epoch), so reads made ahead survive an early exit, a next epoch
  and a state_dict(), and are dropped (after waiting) when
  load_state_dict() moves to another position.
* Slots: a backend that copies through pinned memory gives a ring of
  ``prefetch + 2`` slots; a reader refills one only after the copy out of
  it has finished (the backend waits on that copy's event in the reader).
* A streamed backend (DALI) runs its own pipeline over the order's plan; the
  core still owns the order, coverage and state for it.

Iteration follows torch's DataLoader: each iter() is a fresh pass; only a
state loaded with load_state_dict() is continued where it was saved.
"""
from __future__ import annotations

import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..errors import CacheFormatError, LoaderError
from .batch import Batch, Coverage
from .config import LoaderConfig, check_inflight
from .fence import StepFence, cuda_event_factory
from .order import OrderConfig, SampleOrder, resolve_rank_world

STATE_VERSION = 2      # 1: {"order", "coverage"} (fastdata 0.1 wave 1); 2 adds "version" and "backend"


def resolve_device(name: str) -> torch.device:
    """auto: the current CUDA device when there is one, else cpu."""
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise LoaderError(f"device={name!r} but CUDA is not available here; pass device='cpu'")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


class Loader:
    """Iterable over Batch; one pass is one epoch. Resumable via state_dict()/load_state_dict()."""

    def __init__(self, backend, cfg: LoaderConfig) -> None:
        self.backend, self.cfg = backend, cfg
        self.device = backend.device
        rank, world = resolve_rank_world(cfg.rank, cfg.world_size)
        ocfg = OrderConfig(cfg.shuffle, cfg.seed, backend.window, rank, world)
        self.order = SampleOrder(backend.shard_counts, cfg.batch_size, ocfg, cfg.drop_last)
        self.coverage_audit = Coverage(sum(backend.shard_counts))
        self.source = backend.name
        backend.attach(self.order)
        self._pool, self._ring, self._submitted, self._token = None, None, 0, None
        self._inflight: deque = deque()   # reads (and stages) made ahead, oldest first
        self._pass = (0, 0)               # (epoch, position) where the current pass started
        self._resume_pending = False      # set by load_state_dict: the next iter() continues from there
        # the host's lead over the GPU, bounded in batches (fence.py): a sleeping wait, GIL released
        self._fence = StepFence(cfg.max_inflight_batches, cuda_event_factory(self.device, blocking=True))

    # ---- the DataLoader-like surface ------------------------------------------------------------
    def __len__(self) -> int:
        return self.order.batches_per_epoch()

    @property
    def num_classes(self) -> int | None:
        """Classes in the data's label map (a cache's manifest, or the folder/list/tar's classes)."""
        cache = getattr(self.backend, "cache", None)
        label_map = cache.manifest.label_map if cache is not None else \
            getattr(getattr(self.backend, "encoded", None), "label_map", None)
        return len(label_map) if label_map else None

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, "backend": self.backend.kind, "order": self.order.state_dict(),
                "coverage": self.coverage_audit.state_dict()}

    def check_state(self, state: dict) -> None:
        """Raise where load_state_dict(state) would be refused (a newer fastdata's state, or one saved for
        other data or settings), changing nothing: Engine.load checks every part before loading any."""
        version = int(state.get("version", 1))
        if version > STATE_VERSION:
            raise LoaderError(f"loader state of version {version} was saved by a newer fastdata (this one reads "
                              f"up to {STATE_VERSION}); upgrade fastdata to resume this run")
        self.order.check_state(state["order"])

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.order.load_state_dict(state["order"])
        self.coverage_audit.load_state_dict(state["coverage"])
        self._resume_pending = True

    def batches_left(self) -> int:
        """Batches the next iter() will yield."""
        return len(self) if self._fresh_pass_due() else len(self.order.epoch_batches())

    def coverage(self) -> dict:
        """This rank's audit for the current epoch: samples seen, repeated, missed."""
        return self.coverage_audit.report()

    def bound_lead(self, limit: int) -> int:
        """Bound the batches whose GPU work may still be queued when the next is handed out (what
        max_inflight_batches set; 0: no bound) from the next batch on; returns the bound replaced.
        Engine.fit() lifts it for its run: it fences its own optimizer steps (max_inflight_steps), and
        a wait inside next() would be booked as data wait."""
        return self._fence.rebound(check_inflight(limit))

    @property
    def lead_wait(self) -> float:
        """Seconds next() has spent waiting for the GPU to catch up (max_inflight_batches), in total. That
        time is the GPU's backlog, not data wait: a meter of the time in next() (the doctor's) takes it off."""
        return self._fence.waited

    def close(self) -> None:
        self._drop_stale(None)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        self.backend.close()

    # ---- one pass -------------------------------------------------------------------------------
    def _fresh_pass_due(self) -> bool:
        return self.order.position > 0 and not self._resume_pending

    def _start_pass(self) -> list:
        """As with torch's DataLoader every iter() is a fresh pass: a pass left early (break) is not
        continued by the next one, which starts the next epoch; only a loaded state is continued."""
        if self._fresh_pass_due():
            self.order.next_epoch()
        elif self._resume_pending and self.order.position > 0 and not self.order.epoch_batches():
            self.order.next_epoch()   # saved after an epoch's last batch: resume with the next epoch
        self._resume_pending = False
        if self.order.position == 0:
            self.coverage_audit.reset(self.order.epoch)
        return self.order.epoch_batches()

    def _yielded(self, idx) -> None:
        self.order.advance(len(idx))
        self.coverage_audit.add(idx)

    def __iter__(self):
        batches = self._start_pass()
        token = self._token = object()
        if self.backend.streamed:
            yield from self._streamed(len(batches), token)
        else:
            yield from self._read_ahead(batches, token)
        self.order.next_epoch()

    def _check_token(self, token) -> None:
        if self._token is not token:
            raise LoaderError(f"{self.backend.where}: another iteration of this loader started; finish or drop "
                              f"the first iterator before starting the next")

    def _streamed(self, n: int, token):
        for _ in range(n):
            self._check_token(token)
            self._fence.record()
            self._fence.wait()
            idx, images, labels = self.backend.next_batch(self.order.epoch, self.order.position)
            self._yielded(idx)
            yield Batch(images, labels, torch.from_numpy(idx), self.source)

    def _read_ahead(self, batches: list, token):
        epoch, pos = self.order.epoch, self.order.position
        if batches:
            self.backend.begin(batches)
        self._pass = (epoch, pos)
        self._drop_stale((epoch, pos))
        plan = self._plan(epoch, pos)
        for _ in range(len(self._inflight)):  # already in flight: skip them in the plan
            next(plan)
        for k in range(len(batches)):
            self._check_token(token)
            self._fence.record()          # the GPU work launched up to this next()
            while len(self._inflight) <= self.cfg.read_ahead:
                nxt = next(plan, None)
                if nxt is None:
                    break
                self._submit(*nxt)
            batch_no = pos // self.cfg.batch_size + k
            for j in range(min(len(self._inflight), 1 + self.backend.stage_ahead)):
                self._stage(self._inflight[j], batch_no + j)
            self._fence.wait()            # after the reads and stages are under way
            ent = self._inflight.popleft()
            images, labels = self.backend.finish(ent["staged"], ent["idx"])
            self._yielded(ent["idx"])
            yield Batch(images, labels, torch.from_numpy(ent["idx"]), self.source)

    def _plan(self, epoch: int, position: int):
        """(key, indices) of every batch from (epoch, position) on: the rest of this epoch, then the
        next epoch from its start, so reads never stop at an epoch end (a cold start per epoch cost
        the short benchmark epochs several percent)."""
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
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.cfg.reader_threads, thread_name_prefix="fastdata-read")
            self._ring = self.backend.ring(self.cfg.read_ahead + 2)
        slot = self.backend.fresh_slot() if self._ring is None else self._ring[self._submitted % len(self._ring)]
        self._submitted += 1
        if key[0] == self._pass[0]:   # (reads into the next epoch are planned by that pass)
            self.backend.submitted((key[1] - self._pass[1]) // self.cfg.batch_size)
        fut = self._pool.submit(self.backend.read, key, idx, slot)
        self._inflight.append({"key": key, "idx": idx, "slot": slot, "fut": fut, "staged": None})

    def _stage(self, ent, batch_no: int) -> None:
        if ent["staged"] is None:
            out = self._wait(ent["fut"], batch_no)
            ent["staged"] = self.backend.stage(ent["slot"], out, len(ent["idx"]))

    def _wait(self, fut, batch_no: int):
        t0 = None if fut.done() else time.perf_counter()
        try:
            out = fut.result()
            self.backend.waited(0.0 if t0 is None else time.perf_counter() - t0)
            return out
        except (CacheFormatError, LoaderError):   # they name the file and the fix already
            raise
        except Exception as e:  # a reader thread died: say which batch and why
            raise LoaderError(f"{self.backend.where}: reader failed on batch {batch_no} of epoch "
                              f"{self.order.epoch}: {type(e).__name__}: {e}") from e
