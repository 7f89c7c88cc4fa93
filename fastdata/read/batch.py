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

    def __new__(cls, images, labels: torch.Tensor | None = None, indices: torch.Tensor | None = None,
                source: str = ""):
        if labels is None:   # Batch([images, labels]): how collection utilities (Lightning's
            images, labels = images   # apply_to_collection, torch's pin_memory) rebuild a tuple subclass
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
