"""What the decoding backends (pil, nvjpeg) share: a batch's encoded bytes, labels and random draws.

The draws come from (seed, epoch, batch number), so a resumed run crops and
flips the same way (the flips first, then each sample's crop box).
"""
from __future__ import annotations

import numpy as np
import torch

from ..augment import AugmentConfig
from ..encoded import EncodedSource


def batch_rng(seed: int, key, batch_size: int) -> np.random.Generator:
    return np.random.default_rng([seed, key[0], key[1] // batch_size])


def read_encoded(source: EncodedSource, idx: np.ndarray, aug: AugmentConfig, rng: np.random.Generator):
    """(encoded bytes per sample, labels, flip mask)."""
    encoded, labels = source.get_batch(idx)
    return encoded, torch.from_numpy(labels), torch.from_numpy(draw_flips(len(idx), aug, rng))


def draw_flips(n: int, aug: AugmentConfig, rng: np.random.Generator) -> np.ndarray:
    """A batch's flip mask, drawn before its crop boxes (every decoding backend, DALI's windows too)."""
    return rng.random(n) < 0.5 if aug.train and aug.flip else np.zeros(n, bool)


def source_attrs(backend, source: EncodedSource, prefix: str) -> None:
    """The attributes the loader core reads, from an encoded source."""
    backend.encoded = source
    backend.name, backend.where = f"{prefix}-{source.kind}", str(source.path)
    backend.shard_counts, backend.window = source.shard_counts, source.window
