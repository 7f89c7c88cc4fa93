"""GPU JPEG decode backends: DALI (nvJPEG, "mixed"), torchvision's nvJPEG fallback, and CPU.

Imported lazily: `import fastdata` never needs DALI or torchvision.
"""
from __future__ import annotations

import importlib.util

import torch

from .augment import AugmentConfig
from ..errors import FastdataError


def dali_available() -> bool:
    return importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None


def _torchvision_ok() -> bool:
    try:
        import torchvision.io  # noqa: F401

        return True
    except Exception:  # noqa: BLE001 - PyPI torchvision beside a mismatched torch fails at import
        return False


def choose_backend(backend: str) -> str:
    """auto -> dali when installed, else nvjpeg on a GPU with torchvision, else cpu."""
    if backend != "auto":
        return backend
    if dali_available():
        return "dali"
    if torch.cuda.is_available() and _torchvision_ok():
        return "nvjpeg"
    return "cpu"


def decode_loader(path, batch_size: int, *, backend: str = "auto", image_size: int = 224, seed: int = 0,
                  device: str = "auto", dtype: str = "float32", train: bool = True, rank: int | None = None,
                  world_size: int | None = None, augment: AugmentConfig | None = None, **options):
    """A loader that decodes JPEGs (image folder or JPEG cache) with the chosen backend.

    dali: DALI pipeline, device "mixed" on GPU / "cpu" without; nvjpeg: torchvision.io.decode_jpeg on
    the GPU; cpu: DALI's CPU pipeline when installed, else PIL in threads. Batch.source says which ran.
    augment, if given, replaces the AugmentConfig built from image_size/dtype/train.
    """
    from .order import resolve_rank_world
    from .encoded import EncodedSource

    aug = augment or AugmentConfig(size=image_size, dtype=dtype, train=train)
    r, w = resolve_rank_world(rank, world_size)
    source = EncodedSource(path)
    chosen = choose_backend(backend)
    if chosen == "cpu" and dali_available():
        chosen, device = "dali", "cpu"
    if chosen == "dali":
        from .backends.dali import DaliConfig, DaliLoader

        return DaliLoader(source, DaliConfig(batch_size, aug, device, seed, rank=r, world_size=w, **options))
    if chosen in ("nvjpeg", "cpu"):
        from .backends.decode import DecodeConfig, DecodeLoader

        dev = device if device != "auto" else ("cuda" if chosen == "nvjpeg" else "cpu")
        decoder = "nvjpeg" if chosen == "nvjpeg" else "pil"
        return DecodeLoader(source, DecodeConfig(batch_size, aug, dev, decoder, seed, rank=r, world_size=w,
                                                 **options))
    raise FastdataError(f"backend {backend!r}: choose dali, nvjpeg, cpu or auto")


def dali_loader(path, batch_size: int, **kw):
    """fastdata.dali_loader: the DALI backend explicitly (errors clearly if DALI is missing)."""
    return decode_loader(path, batch_size, backend="dali", **kw)
