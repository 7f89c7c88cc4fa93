"""One place that turns (data path, backend) into a loader with the common batch contract."""
from __future__ import annotations

from pathlib import Path

from ..cache.format import MANIFEST, load_manifest
from ..errors import FastdataError
from .augment import AugmentConfig

BACKENDS = ("auto", "cache", "dali", "nvjpeg", "cpu")


def is_cache(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def num_classes(path: str | Path) -> int:
    if is_cache(path):
        return max(1, len(load_manifest(path).label_map))
    p = Path(path)
    if p.is_dir():
        return max(1, sum(1 for d in p.iterdir() if d.is_dir() and not d.name.startswith(".")))
    raise FastdataError(f"--data {path}: neither a fastdata cache nor an image folder")


def make_loader(path, batch_size: int, *, backend: str = "auto", image_size: int = 224, seed: int = 0,
                device: str = "auto", dtype: str = "float32", kernel: str = "auto", **options):
    """cache -> fastdata.loader; image folder or JPEG cache with dali|nvjpeg|cpu -> GPU/CPU decode.

    dtype: the batch dtype (EngineConfig.batch_dtype: the engine's autocast dtype); kernel: the cache
    loader's augmentation kernel (AugmentConfig.kernel)."""
    if backend not in BACKENDS:
        raise FastdataError(f"backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    aug = AugmentConfig(size=image_size, dtype=dtype, kernel=kernel)
    if backend == "cache" or (backend == "auto" and is_cache(path) and load_manifest(path).kind == "raw"):
        from .loader import loader

        return loader(path, batch_size, device=device, seed=seed, augment=aug, **options)
    from .decode_verbs import decode_loader

    return decode_loader(path, batch_size, backend=backend, image_size=image_size, seed=seed, device=device,
                         dtype=dtype, **options)
