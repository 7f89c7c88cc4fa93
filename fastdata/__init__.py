"""fastdata: make PyTorch training GPU-bound instead of input-bound.

Public verbs are imported lazily, so `import fastdata` stays cheap and an
optional backend that is missing (DALI, torchvision) never breaks it.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "AugmentConfig": "fastdata.read.augment",
    "Batch": "fastdata.read.batch",
    "BuildConfig": "fastdata.cache.build",
    "dataloader": "fastdata.read.tune",
    "tuned_dataloader": "fastdata.read.tune",
    "loader": "fastdata.read.verbs",
    "Loader": "fastdata.read.core",
    "LoaderConfig": "fastdata.read.config",
    "Cache": "fastdata.read.reader",
    "CacheDataset": "fastdata.read.dataset",
    "Engine": "fastdata.engine.engine",
    "EngineConfig": "fastdata.engine.config",
    "FastdataError": "fastdata.errors",
    "GpuSampler": "fastdata.monitor.nvml",
    "dali_loader": "fastdata.read.verbs",
    "decode_loader": "fastdata.read.verbs",
    "build_cache": "fastdata.cache.build",
    "load_manifest": "fastdata.cache.format",
    "merge_caches": "fastdata.cache.merge",
    "open_cache": "fastdata.read.reader",
    "seed_everything": "fastdata.engine.checkpoint",
    "stage_cache": "fastdata.cache.stage",
    "verify_cache": "fastdata.cache.verify",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'fastdata' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
