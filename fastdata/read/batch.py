"""The one batch type every loader yields, and the coverage audit they share."""
from __future__ import annotations

import numpy as np
import torch


class Batch(tuple):
    """``(images, labels)``: unpacks as a pair; ``.indices`` and ``.source`` say what and who.

    images: uint8 (N, H, W, C) or float (N, C, H, W) on the target device; labels: int64.
    source names the backend that produced it ("cache-raw", "cache-jpeg", "dali-mixed", "nvjpeg", ...).
    """

    indices: torch.Tensor
    source: str

    def __new__(cls, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor | None = None,
                source: str = ""):
        self = super().__new__(cls, (images, labels))
        self.indices = indices if indices is not None else torch.empty(0, dtype=torch.int64)
        self.source = source
        return self

    @property
    def images(self) -> torch.Tensor:
        return self[0]

    @property
    def labels(self) -> torch.Tensor:
        return self[1]


class Coverage:
    """Counts how often each sample was yielded in the current epoch (seen / repeated / missed)."""

    def __init__(self, num_samples: int) -> None:
        self.counts = np.zeros(num_samples, dtype=np.uint16)
        self.epoch = 0

    def add(self, indices) -> None:
        np.add.at(self.counts, np.asarray(indices, dtype=np.int64), 1)

    def reset(self, epoch: int) -> None:
        self.counts[:] = 0
        self.epoch = epoch

    def report(self) -> dict:
        seen = int((self.counts > 0).sum())
        return {"epoch": self.epoch, "samples": len(self.counts), "seen": seen,
                "repeated": int((self.counts > 1).sum()), "missed": len(self.counts) - seen}

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "seen": np.packbits(self.counts > 0).tobytes(),
                "repeated": np.packbits(self.counts > 1).tobytes()}

    def load_state_dict(self, state: dict) -> None:
        n = len(self.counts)
        seen = np.unpackbits(np.frombuffer(state["seen"], np.uint8))[:n].astype(np.uint16)
        rep = np.unpackbits(np.frombuffer(state["repeated"], np.uint8))[:n].astype(np.uint16)
        self.counts, self.epoch = seen + rep, int(state["epoch"])


class Resumable:
    """What every loader shares: a SampleOrder, the coverage audit, state_dict() and epoch bookkeeping.

    Subclasses set ``self.order`` and ``self.coverage_audit``, call ``_epoch_batches()`` at the start
    of __iter__, ``_yielded(idx)`` for each batch handed out and ``order.next_epoch()`` at the end.
    """

    order: object
    coverage_audit: Coverage

    def __len__(self) -> int:
        return self.order.batches_per_epoch()

    def state_dict(self) -> dict:
        return {"order": self.order.state_dict(), "coverage": self.coverage_audit.state_dict()}

    _resume_pending = False   # set by load_state_dict: the next iter() continues from the loaded position

    def load_state_dict(self, state: dict) -> None:
        self.order.load_state_dict(state["order"])
        self.coverage_audit.load_state_dict(state["coverage"])
        self._resume_pending = True

    def batches_left(self) -> int:
        """Batches the next iter() will yield."""
        if self._fresh_pass_due():
            return len(self)
        return len(self.order.epoch_batches())

    def coverage(self) -> dict:
        """This rank's audit for the current epoch: samples seen, repeated, missed."""
        return self.coverage_audit.report()

    def _fresh_pass_due(self) -> bool:
        return self.order.position > 0 and not self._resume_pending

    def _epoch_batches(self) -> list:
        """Start of __iter__. As with torch's DataLoader every iter() is a fresh pass: a pass left early
        (break) is not continued by the next one, which starts the next epoch. Only a state loaded with
        load_state_dict() is continued, exactly where it was saved."""
        if self._fresh_pass_due():
            self.order.next_epoch()
        self._resume_pending = False
        if self.order.position == 0:
            self.coverage_audit.reset(self.order.epoch)
        return self.order.epoch_batches()

    def _yielded(self, idx) -> None:
        self.order.advance(len(idx))
        self.coverage_audit.add(idx)
