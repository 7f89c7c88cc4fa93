"""fastdata.loader under Lightning: Trainer.fit trains from it, and a mid-epoch checkpoint that
Lightning saved restores the loader's position (examples/lightning_train.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

L = pytest.importorskip("lightning")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from lightning_train import Classifier, make_loader  # noqa: E402


class Record(L.Callback):
    def __init__(self) -> None:
        self.seen: list = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        images, labels = batch     # (Lightning rebuilds the Batch when it moves it: indices do not survive)
        self.seen.append((labels.tolist(), round(float(images.sum()), 2)))


def _trainer(steps: int, rec: Record, tmp_path) -> "L.Trainer":
    return L.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu", callbacks=[rec], default_root_dir=tmp_path)


def test_trainer_fit_and_mid_epoch_resume_from_a_lightning_checkpoint(raw_cache, tmp_path):
    per_epoch = len(make_loader(str(raw_cache), 16, 32))       # 120 samples: 8 batches
    whole = Record()
    _trainer(per_epoch + 3, whole, tmp_path).fit(Classifier(10), train_dataloaders=make_loader(str(raw_cache), 16, 32))
    assert len(whole.seen) == per_epoch + 3

    first = Record()
    trainer = _trainer(5, first, tmp_path)
    trainer.fit(Classifier(10), train_dataloaders=make_loader(str(raw_cache), 16, 32))
    ckpt = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(ckpt)                           # 5 of 8 batches into epoch 0

    rest = Record()
    _trainer(per_epoch + 3, rest, tmp_path).fit(Classifier(10), train_dataloaders=make_loader(str(raw_cache), 16, 32),
                                                ckpt_path=str(ckpt))
    assert first.seen == whole.seen[:5]
    assert rest.seen == whole.seen[5:], "the resumed run must continue with the batches not yet seen"
