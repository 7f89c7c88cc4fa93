"""fastdata.loader as a Lightning train dataloader, with exact mid-epoch resume.

    python examples/lightning_train.py CACHE [--steps 20] [--ckpt last.ckpt]

Lightning saves the state of a dataloader that has state_dict()/load_state_dict() in its
checkpoints (fit_loop -> combined_loader), and restores it before the next iteration: a run
resumed from a mid-epoch checkpoint continues with exactly the samples the interrupted run had
not seen yet. The loader already ships batches on the GPU (augmented there), so tell Lightning
not to move them again only if you use a custom transfer hook; the default one is a no-op for
tensors already on the right device.
"""
from __future__ import annotations

import argparse

import lightning as L
import torch
from torch import nn

import fastdata
from fastdata.read.augment import AugmentConfig


class Classifier(L.LightningModule):
    def __init__(self, classes: int, lr: float = 0.05) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                 nn.Linear(16, classes))
        self.lr = lr

    def training_step(self, batch, _):
        images, labels = batch
        loss = nn.functional.cross_entropy(self.net(images), labels)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def make_loader(cache: str, batch_size: int = 64, size: int = 64):
    return fastdata.loader(cache, batch_size, augment=AugmentConfig(size=size), seed=0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("cache")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ckpt", default=None, help="resume from this checkpoint")
    a = ap.parse_args()
    loader = make_loader(a.cache)
    classes = len(loader.backend.cache.manifest.label_map)
    trainer = L.Trainer(max_steps=a.steps, logger=False, enable_checkpointing=True)
    trainer.fit(Classifier(classes), train_dataloaders=loader, ckpt_path=a.ckpt)


if __name__ == "__main__":
    main()
