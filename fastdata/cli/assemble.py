"""assemble(): the one place that makes (engine, loader) from a run's settings.

`fastdata train`, `fastdata doctor --data` and the benchmarks all come
through here, so every run settles each setting once, in one order:

    seed      seeds Python, NumPy and torch before the model is built; the loader's order uses it too
    device    the engine's (local rank's GPU, else cpu); the loader ships batches there
    rank      the engine's process group (torchrun); the loader splits the samples by it
    dtype     the engine's autocast dtype (EngineConfig.batch_dtype); the loader's augmentation
              writes it, so no cast runs before the first layer and the engine augments nothing
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..engine.config import EngineConfig
from ..errors import EmptyEpochError, FastdataError

log = logging.getLogger("fastdata.engine")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    data: str                           # cache folder, s3:// cache, image folder, file list or tar
    model: str = "resnet50"             # smallnet | resnet18 | resnet50 | module:function
    batch_size: int | str = 256         # or "auto": the largest that fits, searched on synthetic input
    backend: str = "auto"               # fastdata.loader's backend
    image_size: int = 224
    kernel: str = "auto"                # augmentation kernel (AugmentConfig.kernel)
    seed: int = 0
    engine: EngineConfig = field(default_factory=EngineConfig)
    loader_options: tuple[tuple[str, object], ...] = ()   # backend options, e.g. (("threads", 8),)
    allow_empty_classes: bool = False   # an image folder's empty class folders: labels without samples


@dataclass(frozen=True)
class Run:
    engine: object
    loader: object
    batch_size: int
    batch_curve: list | None


def build_loader(run: RunConfig, batch_size: int, device, rank: int, world_size: int, drop_last: bool = True):
    """fastdata.loader for the run: its batches arrive on `device` in the engine's dtype. drop_last: every
    batch full, as training wants (one shape for torch.compile and CUDA graphs; BatchNorm cannot train on
    the 1-sample batch a 9-sample epoch of batch 8 ended with, and `fastdata train` died of it)."""
    from ..read.augment import AugmentConfig
    from ..read.verbs import loader

    aug = AugmentConfig(size=run.image_size, dtype=run.engine.batch_dtype, kernel=run.kernel,
                        channels_last=run.engine.channels_last)
    return loader(run.data, batch_size, backend=run.backend, seed=run.seed, device=str(device), augment=aug,
                  rank=rank, world_size=world_size, allow_empty_classes=run.allow_empty_classes, drop_last=drop_last,
                  **dict(run.loader_options))


def assemble(run: RunConfig) -> Run:
    from ..engine.checkpoint import seed_everything
    from ..engine.distributed import rank, world_size
    from ..engine.engine import Engine
    from ..engine.models import resolve_model
    from ..read.select import num_classes

    if run.batch_size != "auto" and not (isinstance(run.batch_size, int) or str(run.batch_size).isdigit()):
        raise FastdataError(f"batch size {run.batch_size!r}: give a positive integer or 'auto'")
    seed_everything(run.seed)   # before the model is built: its initial weights come from this seed
    classes = num_classes(run.data, allow_empty_classes=run.allow_empty_classes)
    engine = Engine(resolve_model(run.model, classes), run.engine)
    if run.batch_size == "auto":
        from .train import auto_batch

        bs, curve = auto_batch(engine, run.image_size, classes)
    else:
        bs, curve = int(run.batch_size), None
    try:
        loader = build_loader(run, bs, engine.device, rank(), world_size())
    except EmptyEpochError as e:    # fewer samples per rank than one batch
        if run.batch_size == "auto":    # the search ran on synthetic input: a batch of all this rank's data
            log.info("auto batch size %d exceeds the %d samples an epoch gives this rank: using %d", bs,
                     e.samples, e.samples)
            bs = e.samples
        loader = build_loader(run, bs, engine.device, rank(), world_size(), drop_last=run.batch_size == "auto")
    return Run(engine, loader, bs, curve)
