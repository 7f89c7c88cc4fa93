"""`fastdata demo`: the whole path on bundled real photos, in about a minute on 2 CPU cores.

sample JPEG folder (skimage/sklearn photos) -> build-cache -> verify -> fast loader -> a few
training steps of the engine on whatever device is present.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger("fastdata.demo")


def run_demo(out: str | Path = "sample", per_class: int = 24, steps: int = 20) -> dict:
    from .cache.build import BuildConfig, build_cache
    from .cache.verify import verify_cache
    from .read.augment import AugmentConfig
    from .read.verbs import loader
    from .sample import make_image_folder

    out = Path(out)
    src = out / "images"
    if not src.exists():
        make_image_folder(src, per_class)
    result = build_cache(BuildConfig(src=str(src), dest=str(out / "cache"), size=144, shard_size="8MB"))
    print("build:", result.summary())
    print("verify:", verify_cache(out / "cache").text())
    dl = loader(out / "cache", 32, augment=AugmentConfig(size=128), seed=0)
    t0, n = time.perf_counter(), 0
    for images, labels in dl:
        n += len(labels)
    print(f"loader: {n} samples as {tuple(images.shape)} {images.dtype} on {images.device}, "
          f"{n / (time.perf_counter() - t0):.0f} img/s; coverage {dl.coverage()}")
    report = {"samples": n}
    try:
        from .engine.demo import train_demo
    except ImportError:
        return report
    report.update(train_demo(out / "cache", steps))
    return report


def add_cli(sub, commands: dict) -> None:
    p = sub.add_parser("demo", help="sample photos -> cache -> loader -> a few training steps")
    p.add_argument("--out", default="sample", help="folder for the sample images and cache")
    p.add_argument("--per-class", type=int, default=24, help="images per class in the sample")
    p.add_argument("--steps", type=int, default=20, help="training steps to run")
    commands["demo"] = lambda a: (run_demo(a.out, a.per_class, a.steps), 0)[1]
