"""A few engine steps on the demo cache: proves the whole path end to end on any machine."""
from __future__ import annotations

from pathlib import Path


def train_demo(cache: Path, steps: int) -> dict:
    import torch

    from ..read.augment import AugmentConfig
    from ..read.verbs import loader
    from .config import EngineConfig
    from .engine import Engine
    from .models import SmallNet

    cuda = torch.cuda.is_available()
    cfg = EngineConfig(precision="bf16", lr=0.05, log_every=5, cuda_graph=cuda)
    dl = loader(cache, 32, augment=AugmentConfig(size=128, dtype=cfg.batch_dtype), seed=0)
    engine = Engine(SmallNet(len(dl.backend.cache.manifest.label_map)), cfg)
    report = engine.fit(dl, steps=steps, epochs=100)
    losses = [round(r["loss"], 3) for r in report["history"]]
    print(f"train: {report['steps']} steps of SmallNet on {engine.device}: loss {losses}, "
          f"{report['img_per_s']:.0f} img/s, data wait {report['data_wait_frac']:.0%}")
    return report
