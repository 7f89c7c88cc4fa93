"""fastdata.loader(): one verb for every read path, and the aliases it replaces.

    fastdata.loader(data, batch_size, backend="auto", ...)   -> core.Loader

data is a cache folder, an ``s3://`` cache, an open Cache, an image folder,
a file list, a WebDataset-style tar (or folder of tars), or a discovered
cache.sources.Source. backend "auto" picks:

    raw cache, or any fixed-shape cache read without augmentation   -> raw
    JPEGs (cache or files): DALI installed -> dali; a GPU with torchvision -> nvjpeg; else pil

``decode_loader`` and ``dali_loader`` (wave 1) stay one release as aliases.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import numbers
from pathlib import Path

import torch

from ..errors import LoaderError
from .augment import AugmentConfig
from .config import BACKENDS, DecodeOptions, LoaderConfig, split_options
from .core import Loader, resolve_device
from .._util import user_path
from .reader import Cache, open_cache
from ..stores.s3 import is_url
from .select import is_cache

log = logging.getLogger("fastdata.loader")
LEGACY = {"cache": "raw"}          # wave-1 names; "cpu" is resolved by choose_backend


def dali_available() -> bool:
    return importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None


def _torchvision_ok() -> bool:
    try:
        import torchvision.io  # noqa: F401

        return True
    except Exception:  # noqa: BLE001 - PyPI torchvision beside a mismatched torch fails at import
        return False


def choose_backend(backend: str, device: str = "auto") -> str:
    """A decoding backend for JPEGs. auto: dali when installed, else nvjpeg on a GPU with torchvision,
    else pil; cpu: DALI's CPU pipeline when installed, else pil."""
    if backend not in ("auto", "cpu"):
        return LEGACY.get(backend, backend)
    if dali_available():
        return "dali"
    if backend == "auto" and device != "cpu" and torch.cuda.is_available() and _torchvision_ok():
        return "nvjpeg"
    return "pil"


def _data_kind(data) -> tuple[str, bool]:
    """(raw | jpeg | bytes | encoded, fixed shape?) of what `data` names."""
    if isinstance(data, Cache):
        return data.manifest.kind, data.manifest.sample_shape is not None
    if is_url(data):
        return "raw", True            # read through the store; the raw backend checks the manifest
    if isinstance(data, (str, Path)) and is_cache(data):
        from ..cache.format import load_manifest

        m = load_manifest(data)
        return m.kind, m.sample_shape is not None
    return "encoded", False


def _pick(backend: str, data, augment, device: str) -> str:
    kind, fixed = _data_kind(data)
    if backend == "auto" and (kind == "raw" or (augment is None and fixed)):
        return "raw"
    if backend == "cpu" and kind == "raw":
        return "raw"
    if backend == "auto" and kind == "jpeg" and device != "cpu" and torch.cuda.is_available() and _torchvision_ok():
        # a JPEG cache (every sample a JPEG) decodes faster through nvjpeg than DALI's fed path, alone
        # and feeding a model, on the H200 (README, "Compact caches"); folders, which may hold other
        # formats, stay with DALI
        return "nvjpeg"
    chosen = choose_backend(backend, device)
    if chosen not in BACKENDS:
        raise LoaderError(f"backend {backend!r}: choose one of auto, {', '.join(BACKENDS)}")
    return chosen


def _unreadable(backend: str, key: str) -> bool:
    """Whether the backend's decoder cannot read this input, by its name: DALI reads no GIF (one failed a
    whole batch, naming no file); nvJPEG reads JPEGs only (a PNG folder failed its first batch)."""
    ext = key.lower().rsplit(".", 1)[-1]
    return ext == "gif" if backend == "dali" else backend == "nvjpeg" and ext not in ("jpg", "jpeg")


def _decodable_backend(source, cfg: LoaderConfig, requested: str) -> LoaderConfig:
    """cfg, or backend pil where the inputs hold files the chosen GPU decoder cannot read: chosen by
    auto/cpu, PIL reads them (with a warning that says why); asked for by name, a LoaderError names them."""
    refused = [it.path for it in source.items or () if _unreadable(cfg.backend, it.key)]
    if not refused:
        return cfg
    kind = "GIF" if cfg.backend == "dali" else "not JPEG"
    what = f"{len(refused)} file(s) backend {cfg.backend} cannot decode ({kind}), e.g. {refused[0]}"
    if requested == cfg.backend:
        raise LoaderError(f"{source.path}: {what}; use backend='pil', convert them, or build a cache with "
                          f"`fastdata build-cache` (which decodes every format PIL reads)")
    log.warning("%s: %s; decoding with PIL instead (backend='pil'); build a cache with "
                "`fastdata build-cache` for speed", source.path, what)
    return dataclasses.replace(cfg, backend="pil", options=DecodeOptions(integrity=cfg.options.integrity)).check()


def _make_backend(data, cfg: LoaderConfig, device: torch.device, requested: str = "auto"):
    if cfg.backend == "raw":
        from .backends.raw import RawBackend

        opts = cfg.options
        if opts.stage and not isinstance(data, Cache):
            from ..cache.stage import stage_cache

            data = stage_cache(data, opts.stage)
        cache = data if isinstance(data, Cache) else open_cache(data, opts.integrity, opts.remote)
        return RawBackend(cache, cfg, device)
    from .encoded import EncodedSource

    source = EncodedSource(data.path if isinstance(data, Cache) else data, cfg.options.integrity,
                           allow_empty_classes=cfg.allow_empty_classes)
    if cfg.backend in ("dali", "nvjpeg"):
        cfg = _decodable_backend(source, cfg, requested)
    if cfg.backend == "pil":
        from .backends.pil import PilBackend as cls
    elif cfg.backend == "nvjpeg":
        from .backends.nvjpeg import NvjpegBackend as cls
    else:
        from .backends.dali import DaliBackend as cls
    return cls(source, cfg, device)


def loader(data, batch_size: int, *, backend: str = "auto", device: str = "auto", shuffle: bool = True,
           seed: int = 0, drop_last: bool = False, augment: bool | AugmentConfig | None = None,
           threads: int | None = None, prefetch: int | None = None, rank: int | None = None,
           world_size: int | None = None, allow_empty_classes: bool = False, max_inflight_batches: int = 3,
           **options) -> Loader:
    """Batches of (images, labels) on `device`, from any data fastdata reads.

    augment: None/False -> uint8 NHWC batches (backend raw); True -> train-time RandomResizedCrop(224),
    flip and normalise to float32 NCHW channels_last; or an AugmentConfig. The decoding backends always
    crop to augment.size (AugmentConfig() when none is given). options: the backend's own settings
    (config.RawOptions, DecodeOptions, NvjpegOptions, DaliOptions); one the backend does not take is a
    LoaderError. allow_empty_classes: an image folder's class folders without images become labels
    without samples (ImageFolder's allow_empty) instead of an error naming one. max_inflight_batches:
    how many handed-out batches' GPU work may still be queued when the next is handed out (fence.py; 0:
    no bound).
    """
    augment = AugmentConfig() if augment is True else (None if augment is False else augment)
    data = user_path(data)
    name = _pick(LEGACY.get(backend, backend), data, augment, device)
    if name != "raw" and augment is None:
        augment = AugmentConfig()
    dev = torch.device("cpu") if name == "pil" and device == "auto" else resolve_device(device)
    if isinstance(batch_size, numbers.Integral) and not isinstance(batch_size, bool):
        batch_size = int(batch_size)    # numpy's integers too (checked in LoaderConfig.check)
    if isinstance(seed, numbers.Integral) and seed < 0:
        seed = int(seed) & (2**64 - 1)  # as torch.manual_seed takes a negative seed (numpy's refuse one)
    cfg = LoaderConfig(batch_size=batch_size, backend=name, device=str(dev), shuffle=shuffle, seed=seed,
                       drop_last=drop_last, augment=augment, threads=threads, prefetch=prefetch, rank=rank,
                       world_size=world_size, allow_empty_classes=bool(allow_empty_classes),
                       max_inflight_batches=max_inflight_batches,
                       options=split_options(name, options)).check()
    chosen = _make_backend(data, cfg, dev, LEGACY.get(backend, backend))
    try:
        return Loader(chosen, chosen.cfg)     # (the backend's cfg: a folder DALI cannot read goes to pil)
    except Exception:
        chosen.close()                        # (a decode pool or DALI pipeline the backend started)
        raise


def decode_loader(path, batch_size: int, *, backend: str = "auto", image_size: int = 224, seed: int = 0,
                  device: str = "auto", dtype: str = "float32", train: bool = True,
                  augment: AugmentConfig | None = None, **options) -> Loader:
    """Alias kept for one release: fastdata.loader with a decoding backend (dali | nvjpeg | cpu | auto)
    and an AugmentConfig built from image_size, dtype and train."""
    aug = augment or AugmentConfig(size=image_size, dtype=dtype, train=train)
    chosen = choose_backend(backend, device)
    if backend == "cpu" and device == "auto":
        device = "cpu"
    return loader(path, batch_size, backend=chosen, device=device, seed=seed, augment=aug, **options)


def dali_loader(path, batch_size: int, **kw) -> Loader:
    """Alias kept for one release: fastdata.loader(..., backend="dali")."""
    return decode_loader(path, batch_size, backend="dali", **kw)
