"""Checkpoints: atomic writes, loading that runs no code, and the run's random state.

Writes: torch.save to *.tmp, fsync, rename, so a kill mid-write leaves the old
checkpoint intact; an existing checkpoint of a later step is never replaced by
an earlier one (a restarted job must not roll a run back).

Reads: ``torch.load(weights_only=True)``. A checkpoint holds only tensors and
plain containers (dict, list, tuple, str, bytes, numbers, None): the numpy RNG
state is stored as a list, not a numpy object, so nothing needs unpickling
beyond torch's own allowlist. A file that asks for anything else (a crafted
pickle, an old checkpoint that stored numpy arrays) is refused with a
CheckpointError naming the file and the type; ``trust=True``
(`fastdata train --trust-checkpoint`) opens checkpoints this package wrote
before, once, with full unpickling: only for files from a trusted source.
"""
from __future__ import annotations

import logging
import os
import pickle
import random
import re
import tempfile
from pathlib import Path

import numpy as np
import torch

from .._util import atomic_replace
from ..errors import CheckpointError

log = logging.getLogger("fastdata.engine")
_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)")


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (every GPU). Call it before building the model: weights are
    drawn when the model is made, so seeding later cannot make two runs start alike."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(), "numpy": [name, keys.tolist(), pos, has_gauss, gauss],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])


def saved_step(path: Path) -> int | None:
    """The step recorded in an existing checkpoint (memory-mapped, so cheap), or None."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return int(state["step"])
    except Exception:  # noqa: BLE001 - unreadable or foreign: nothing to protect
        return None


def save_checkpoint(path: str | Path, state: dict) -> Path | None:
    """Write state atomically; returns None (and writes nothing) when path holds a later step."""
    path = Path(path)
    if path.exists() and (prev := saved_step(path)) is not None and prev > state["step"]:
        log.warning("%s holds step %d, later than this run's step %d: left as it is", path, prev, state["step"])
        return None
    tmp = path.with_name(path.name + ".tmp")
    try:   # (no probe file here: train probes the folder once before it trains, and this names the cause)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(state, tmp)
        atomic_replace(tmp, path)
    except (OSError, RuntimeError) as e:   # a full disk surfaces from torch's zip writer as RuntimeError
        tmp.unlink(missing_ok=True)        # (ours: the half-written file); the previous checkpoint stays
        why = e.strerror if isinstance(e, OSError) and e.strerror else _disk_reason(path.parent, e)
        kept = "the previous checkpoint there is intact" if path.exists() else "nothing was saved"
        raise CheckpointError(f"{path}: cannot save checkpoint ({why}); {kept}: free space or choose another "
                              f"--ckpt-dir, then rerun to resume") from None
    return path


def _disk_reason(folder: Path, e: Exception) -> str:
    """torch's zip writer reports a full disk as 'unexpected pos ...': say so when the disk is full."""
    try:
        st = os.statvfs(folder)
        if st.f_bavail * st.f_frsize < (1 << 20):
            return "No space left on device"
    except OSError:
        pass
    return " ".join(str(e).split())[:200]


def ensure_writable(folder: Path) -> None:
    """Make the checkpoint folder and write a probe file there: a run that cannot save learns it
    before it trains, not at its first checkpoint hours later."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".fastdata-probe-"):
            pass
    except OSError as e:
        raise CheckpointError(f"{folder}: cannot write checkpoints there ({e.strerror or e}); choose another "
                              f"--ckpt-dir") from None


def load_checkpoint(path: str | Path, map_location="cpu", *, trust: bool = False) -> dict:
    path = Path(path)
    if path.is_dir():       # the --ckpt-dir a run saved into: its last.pt
        if not (path / "last.pt").is_file():
            raise CheckpointError(f"{path}: a folder without last.pt; give a checkpoint file, or the --ckpt-dir "
                                  f"a run saved into")
        path = path / "last.pt"
    if not path.is_file():
        raise CheckpointError(f"{path}: no checkpoint there; check --resume, or start without it")
    try:
        return torch.load(path, map_location=map_location, weights_only=not trust)
    except pickle.UnpicklingError as e:
        wanted = _GLOBAL.search(str(e))
        what = f"the type {wanted.group(1)}" if wanted else "an object that is not a tensor or plain data"
        raise CheckpointError(f"{path}: refused: it asks to unpickle {what}, and opening it could run code; "
                              f"if you wrote it with an earlier fastdata and trust it, resume once with "
                              f"--trust-checkpoint (the next save is in the safe format)") from None
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise CheckpointError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e}); it is damaged or not "
                              f"a fastdata checkpoint; resume from an earlier one") from e


def _misfit(what: str, path, detail: str) -> CheckpointError:
    return CheckpointError(f"{path}: its {what} does not fit this run ({detail[:200]}); resume with the same "
                           f"--model, data classes and optimizer, or start afresh with another --ckpt-dir")


def check_model_fits(model: torch.nn.Module, state: dict, path) -> None:
    """Raise before anything is loaded where model.load_state_dict(state) would fail: torch copies the
    tensors that fit as it goes, so a late mismatch left a model half restored."""
    mine = model.state_dict()
    missing = [k for k in mine if k not in state]
    unexpected = [k for k in state if k not in mine]
    if missing or unexpected:
        detail = f"missing key {missing[0]!r}" if missing else f"unexpected key {unexpected[0]!r}"
        more = len(missing) + len(unexpected) - 1
        raise _misfit("model", path, detail + (f" and {more} more" if more else ""))
    for k, v in mine.items():
        theirs = state[k]
        if isinstance(v, torch.Tensor) and isinstance(theirs, torch.Tensor) and theirs.shape != v.shape:
            raise _misfit("model", path, f"size mismatch for {k}: checkpoint {tuple(theirs.shape)}, "
                                         f"this run {tuple(v.shape)}")


def load_optimizer(optimizer: torch.optim.Optimizer, state: dict, path) -> None:
    """optimizer.load_state_dict(state), or, where torch refuses it, the optimizer as it was: torch swaps
    the state in before an optimizer's __setstate__ can fail on it (AdamW over SGD's state: KeyError 'step')."""
    if hasattr(optimizer, "consolidate_state_dict"):    # ZeRO: its sharded state has no local snapshot
        return load_into(optimizer, state, "optimizer state", path)
    before = optimizer.state_dict()     # references, not copies: a failed load makes new tensors
    try:
        load_into(optimizer, state, "optimizer state", path)
    except CheckpointError:
        optimizer.load_state_dict(before)
        raise


def load_into(target, state, what: str, path) -> None:
    """target.load_state_dict(state), a mismatch named in one line: a checkpoint of another model, or of
    data with another number of classes (torch's error is a multi-line traceback)."""
    try:
        target.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError) as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise _misfit(what, path, lines[1] if len(lines) > 1 else f"{type(e).__name__}: {e}") from None
