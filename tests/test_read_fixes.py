"""Read side as a new user meets it (issue #17): the PIL decode path, and DataLoader pass semantics."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.cache.codecs import CodecConfig, decode
from fastdata.read.augment import AugmentConfig, normalize
from fastdata.errors import LoaderError

from helpers import epoch_indices


@pytest.fixture
def pil_backend(monkeypatch):
    """backend="cpu" without DALI: the PIL decode path (DALI is installed in CI)."""
    import fastdata.read.verbs as dali

    monkeypatch.setattr(dali, "dali_available", lambda: False)


def _odd_folder(root, photo: np.ndarray):
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    gray = (np.linspace(0, 65535, 80 * 60).reshape(60, 80)).astype(np.uint16)
    Image.fromarray(gray).save(root / "a" / "deep.png")          # 16-bit grayscale PNG
    img = Image.fromarray(photo[:200, :300])
    exif = img.getexif()
    exif[0x0112] = 6                                              # stored sideways, EXIF says rotate
    img.save(root / "b" / "sideways.jpg", exif=exif, quality=95)
    return root


def test_pil_path_decodes_like_the_cache_builder(photos, tmp_path, pil_backend):
    src = _odd_folder(tmp_path / "src", photos["astronaut"])
    aug = AugmentConfig(size=32, train=False, crop_fraction=1.0, flip=False, channels_last=False)
    dl = fastdata.decode_loader(src, 2, backend="cpu", device="cpu", augment=aug, shuffle=False)
    batch = next(iter(dl))
    assert batch.source.startswith("pil")
    files = [src / "a" / "deep.png", src / "b" / "sideways.jpg"]
    ref = np.stack([np.asarray(decode(p.read_bytes(), CodecConfig(size=32))) for p in files])
    ref = normalize(torch.from_numpy(ref), aug)
    assert (batch.images - ref).abs().mean() < 0.05   # not white, and upright


def test_pil_path_names_a_truncated_file(photos, tmp_path, pil_backend):
    src = _odd_folder(tmp_path / "src", photos["astronaut"])
    bad = src / "b" / "sideways.jpg"
    bad.write_bytes(bad.read_bytes()[:400])
    dl = fastdata.decode_loader(src, 2, backend="cpu", device="cpu", image_size=32)
    with pytest.raises(LoaderError, match=f"{bad}: cannot decode"):
        next(iter(dl))


def test_new_for_loop_after_break_is_a_fresh_pass_and_state_resumes_exactly(raw_cache):
    ref = fastdata.loader(raw_cache, 16, device="cpu", seed=5)
    epoch0, epoch1 = epoch_indices(ref), epoch_indices(ref)
    dl = fastdata.loader(raw_cache, 16, device="cpu", seed=5)
    for k, _ in enumerate(dl):
        if k == 1:
            break
    state = dl.state_dict()
    assert dl.batches_left() == len(epoch1)
    assert [b.tolist() for b in epoch_indices(dl)] == [b.tolist() for b in epoch1]   # as DataLoader does
    again = fastdata.loader(raw_cache, 16, device="cpu", seed=5)
    again.load_state_dict(state)
    assert again.batches_left() == len(epoch0) - 2
    assert [b.tolist() for b in epoch_indices(again)] == [b.tolist() for b in epoch0[2:]]


@pytest.mark.parametrize("backend", ["auto", "pil"])
def test_a_dangling_symlink_in_a_folder_read_directly_is_left_out_with_a_warning(image_folder, tmp_path, backend,
                                                                                  caplog):
    """A build quarantines a dangling link; the loader reading the folder directly handed it to the decoder
    and failed that batch mid-epoch, saying "the image folder changed since the loader started" (it had
    not). Discovery now marks it, so the loader leaves it out and names it once."""
    import os
    import shutil

    src = tmp_path / "src"
    shutil.copytree(image_folder, src)
    first_class = sorted(p for p in src.iterdir() if p.is_dir())[0]
    os.symlink(tmp_path / "gone.jpg", first_class / "lost.jpg")
    dl = fastdata.loader(src, 8, backend=backend, device="cpu", augment=True, shuffle=False)
    seen = sum(len(b.labels) for b in dl)
    assert seen == sum(1 for p in src.rglob("*.jpg") if p.exists())
    assert f"lost.jpg: dangling symlink: its target {tmp_path / 'gone.jpg'} does not exist" in caplog.text
