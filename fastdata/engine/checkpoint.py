"""Atomic checkpoints: torch.save to *.tmp, fsync, rename. A kill mid-write leaves the old one intact."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from .._util import atomic_replace
from ..errors import EngineError


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str | Path, state: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    atomic_replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    path = Path(path)
    if not path.is_file():
        raise EngineError(f"{path}: no checkpoint there; check --resume, or start without it")
    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise EngineError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e}); it is damaged or not "
                          f"a fastdata checkpoint; resume from an earlier one") from e
