"""fastdata: make PyTorch training GPU-bound instead of input-bound.

The flow, and the files that carry it::

  source       cache/sources.py (image folder, file list, s3:// prefix), cache/tarsource.py (WebDataset
               tars); read_item() reads an item's bytes for the build and for the decoding backends
    -> build   cache/build.py, jobs.py, codecs.py (the one decode), writers.py, journal.py (resume),
               executors.py (process pool | Dask), merge.py (--part i/n), verify.py, plan.py (sizes)
    -> shards  cache/format.py (manifest, layout), cache/shardfile.py (opening a shard, refusing code)
    -> store   stores/local.py (a folder; cache/stage.py makes a tmpfs copy), stores/fetch.py + s3.py
               (object storage through a bounded local folder)
    -> loader  read/verbs.py (fastdata.loader: picks the backend), read/config.py (LoaderConfig),
               read/core.py (the one Loader: order.py, batch.py coverage, read-ahead, slots, state)
    -> backend read/backends/raw.py (fill.py, table.py + gather.py, stream.py), pil.py, nvjpeg.py,
               dali.py (dali_plan.py, dali_crop.py); augment.py + augment_triton.py, crop.py (plans),
               crop_box.py + header.py (one crop draw per batch from header sizes: pil, nvjpeg, dali)
    -> device  pinned slots, side-stream copies, one augmentation kernel in the batch dtype
    -> engine  engine/engine.py (fit, train_step), step.py, graph.py, distributed.py, checkpoint.py
  cli/assemble.py makes (engine, loader) from one RunConfig for `train`, `doctor` and benchmarks;
  monitor/ (nvml.py, profile.py, doctor.py, bootstrap.py for unmodified scripts) watches the last three.

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
