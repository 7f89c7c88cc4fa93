"""DALI CPU pipeline (nvidia-dali-cuda120 runs CPU pipelines with device_id=None) and the PIL fallback."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata.read.verbs import choose_backend, decode_loader
from fastdata.read.augment import AugmentConfig
from fastdata.errors import LoaderError

from helpers import check_resume, epoch_indices, pil_reference as _pil_reference

pytest.importorskip("nvidia.dali")
EVAL = dict(augment=AugmentConfig(size=64, train=False, crop_fraction=1.0), shuffle=False, device="cpu")


@pytest.mark.parametrize("backend", ["dali", "cpu"])
def test_center_crop_matches_pil_reference(image_folder, backend):
    ref, labels = _pil_reference(image_folder)
    batches = list(decode_loader(image_folder, 16, backend=backend, **EVAL))
    assert batches[0].source.startswith("dali-cpu")
    images = torch.cat([b.images.float() for b in batches])
    got_labels = torch.cat([b.labels for b in batches])
    assert images.shape == ref.shape and got_labels.dtype == torch.int64
    assert got_labels.tolist() == labels
    diff = (images - ref).abs()
    assert diff.mean() < 0.08 and diff.median() < 0.05  # different resize filters, same picture


def test_pil_fallback_matches_reference(image_folder, monkeypatch):
    import fastdata.read.verbs as dali_mod

    monkeypatch.setattr(dali_mod, "dali_available", lambda: False)
    ref, labels = _pil_reference(image_folder)
    batches = list(decode_loader(image_folder, 16, backend="cpu", **EVAL))
    assert batches[0].source == "pil-files"
    images = torch.cat([b.images.float().contiguous() for b in batches])
    assert torch.cat([b.labels for b in batches]).tolist() == labels
    assert (images - ref).abs().mean() < 0.08


def test_cache_source_and_file_source_agree(image_folder, jpeg_cache):
    kw = dict(backend="dali", **EVAL)
    files = torch.cat([b.images for b in decode_loader(image_folder, 16, **kw)])
    cache = torch.cat([b.images for b in decode_loader(jpeg_cache, 16, **kw)])
    assert files.shape == cache.shape
    assert (files - cache).abs().mean() < 0.1  # the cache holds a quality-95 re-encode at 64 px


@pytest.mark.parametrize("world", [2, 3])
def test_rank_split_complete_and_equal(image_folder, world):
    per = [np.concatenate(epoch_indices(decode_loader(image_folder, 8, backend="dali", image_size=32, device="cpu",
                                                      rank=r, world_size=world))) for r in range(world)]
    assert {len(p) for p in per} == {120 // world}
    joined = np.concatenate(per)
    assert len(np.unique(joined)) == len(joined) == 120 - 120 % world


@pytest.mark.parametrize("reader,pipelines", [("native", 1), ("feed", 1), ("native", 2), ("feed", 3)])
def test_train_mode_shapes_and_resume(image_folder, reader, pipelines):
    make = lambda: decode_loader(image_folder, 8, backend="dali", image_size=32, device="cpu", seed=5,  # noqa: E731
                                 file_reader=reader, pipelines=pipelines)
    b = next(iter(make()))
    assert b.images.shape == (8, 3, 32, 32) and b.images.is_contiguous(memory_format=torch.channels_last)
    check_resume(make, 5)


def test_raw_cache_is_refused_with_advice(raw_cache):
    with pytest.raises(LoaderError, match="needs no decoding"):
        decode_loader(raw_cache, 8, backend="dali", device="cpu")


def test_auto_backend_prefers_dali():
    assert choose_backend("auto") == "dali"


@pytest.mark.parametrize("reader,pipelines", [("native", 1), ("feed", 1), ("native", 2)])
def test_epoch_left_early_continues_with_unseen_samples(image_folder, reader, pipelines):
    """The async pipeline holds prefetched batches when an epoch is left early; the next pass (a fresh
    one, as with DataLoader) must not hand them out, and a restored state continues exactly."""
    make = lambda: decode_loader(image_folder, 8, backend="dali", image_size=32, device="cpu", seed=3,  # noqa: E731
                                 file_reader=reader, pipelines=pipelines)
    ref = make()
    full, full2 = epoch_indices(ref), epoch_indices(ref)
    dl = make()
    seen = []
    for k, b in enumerate(dl):
        seen.append(b.indices.numpy().copy())
        if k == 2:
            break
    state = dl.state_dict()
    assert [a.tolist() for a in epoch_indices(dl)] == [a.tolist() for a in full2]
    dl.load_state_dict(state)
    rest = epoch_indices(dl)
    assert [a.tolist() for a in seen + rest] == [a.tolist() for a in full]
    assert dl.coverage()["repeated"] == 0 and dl.coverage()["missed"] == 0


def test_decode_failure_is_raised_with_the_source_path(image_folder, tmp_path):
    import shutil

    src = tmp_path / "images"
    shutil.copytree(image_folder, src)
    bad = sorted(src.rglob("*.jpg"))[9]
    bad.write_bytes(b"not a jpeg at all" * 10)
    for reader in ("native", "feed"):
        dl = decode_loader(src, 8, backend="dali", image_size=32, device="cpu", shuffle=False, file_reader=reader)
        with pytest.raises(LoaderError, match=f"cannot decode {bad}.*quarantines"):
            for _ in dl:
                pass


def _count_pipelines(dl) -> list:
    built, start = [], dl.backend._start
    dl.backend._start = lambda: (built.append(1), start())
    return built


@pytest.mark.parametrize("reader,pipelines", [("native", 1), ("feed", 1), ("native", 2), ("feed", 2)])
def test_epochs_run_through_one_pipeline(image_folder, reader, pipelines):
    """No drain and refill at epoch ends: one start serves several epochs, each exactly the order's
    epoch (a short last batch included), labels those of the files; batches taken in turn from
    several pipelines come out in the order's order."""
    dl = decode_loader(image_folder, 16, backend="dali", image_size=32, device="cpu", seed=7, file_reader=reader,
                       pipelines=pipelines)
    built = _count_pipelines(dl)
    labels = {i: item.label for i, item in enumerate(dl.backend.encoded.items)}
    for epoch in range(3):
        batches = list(dl)
        want = dl.order.epoch_batches(epoch, 0)
        assert [b.indices.tolist() for b in batches] == [w.tolist() for w in want]
        assert [len(b.labels) for b in batches] == [16] * 7 + [8]
        assert all(b.labels.tolist() == [labels[i] for i in b.indices.tolist()] for b in batches)
        assert dl.coverage()["seen"] == 120 and dl.coverage()["repeated"] == 0
    assert len(built) == 1


def test_native_reader_starts_a_new_files_list_where_the_last_ended(image_folder, monkeypatch):
    """A files list holds a bounded number of batches; the next pipeline continues the order exactly,
    also where a list ends inside an epoch."""
    import fastdata.read.backends.dali_plan as plan_mod

    monkeypatch.setattr(plan_mod, "PLAN_SAMPLES", 48)    # 3 batches per files list, 7 batches per epoch
    make = lambda reader: decode_loader(image_folder, 16, backend="dali", image_size=32, device="cpu",  # noqa: E731
                                        seed=2, file_reader=reader, drop_last=True)
    native, feed = make("native"), make("feed")
    built = _count_pipelines(native)
    for _ in range(2):
        assert [a.tolist() for a in epoch_indices(native)] == [a.tolist() for a in epoch_indices(feed)]
    assert len(built) == 5    # 14 batches, 3 per list


def test_drop_last_bigger_than_the_data_is_refused(image_folder):
    with pytest.raises(LoaderError, match="no batch of the 120 samples"):
        decode_loader(image_folder, 256, backend="dali", image_size=32, device="cpu", drop_last=True)


@pytest.mark.parametrize("reader", ["native", "feed"])
def test_train_crops_survive_a_resume_pixel_for_pixel(image_folder, reader):
    """Crops and flips come from (seed, epoch, batch): a rebuilt pipeline decodes the same pixels."""
    make = lambda: decode_loader(image_folder, 8, backend="dali", image_size=32, device="cpu", seed=4,  # noqa: E731
                                 file_reader=reader, train=True)
    full = [(b.indices.clone(), b.images.clone()) for b in make()]
    first = make()
    for k, _ in enumerate(first):
        if k == 4:
            break
    second = make()
    second.load_state_dict(first.state_dict())
    rest = [(b.indices.clone(), b.images.clone()) for b in second]
    assert len(rest) == len(full) - 5
    for (ia, xa), (ib, xb) in zip(full[5:], rest):
        assert torch.equal(ia, ib) and torch.equal(xa, xb)
    assert not torch.equal(full[0][1], full[1][1][:len(full[0][1])])


def test_auto_backend_takes_nvjpeg_for_a_jpeg_cache_on_a_gpu(jpeg_cache, image_folder, monkeypatch):
    """A JPEG cache holds only JPEGs, which nvjpeg decodes faster than DALI's fed path; folders (any
    format) keep DALI; without a GPU both stay off nvjpeg."""
    from fastdata.read import verbs

    aug = AugmentConfig()
    assert verbs._pick("auto", jpeg_cache, aug, "cuda") == "dali"         # no GPU here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(verbs, "_torchvision_ok", lambda: True)
    assert verbs._pick("auto", jpeg_cache, aug, "cuda") == "nvjpeg"
    assert verbs._pick("auto", jpeg_cache, aug, "cpu") == "dali"
    assert verbs._pick("auto", image_folder, aug, "cuda") == "dali"
    assert verbs._pick("dali", jpeg_cache, aug, "cuda") == "dali"


def test_a_folder_with_a_gif_is_read_by_pil_under_auto_and_refused_by_name(tmp_path, caplog):
    """DALI's decoder reads no GIF, and one GIF failed a whole batch with a message naming no file."""
    from PIL import Image

    from fastdata import loader

    from helpers import noise_folder

    noise_folder(tmp_path / "src")
    rng = np.random.default_rng(1)
    gif = tmp_path / "src" / "b" / "moving.gif"
    frames = [Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)) for _ in range(2)]
    frames[0].save(gif, save_all=True, append_images=frames[1:])
    with pytest.raises(LoaderError, match=f"1 file\\(s\\) backend dali cannot decode \\(GIF\\), e.g. {gif}; use backend='pil'"):
        loader(tmp_path / "src", 4, backend="dali", device="cpu")
    with caplog.at_level("WARNING", logger="fastdata.loader"):
        auto = loader(tmp_path / "src", 4, backend="auto", device="cpu", shuffle=False, augment=EVAL["augment"])
        batches = list(auto)
    assert "decoding with PIL instead" in caplog.text and batches[0].source == "pil-files"
    assert sorted(torch.cat([b.labels for b in batches]).tolist()) == [0, 0, 0, 1, 1, 1, 1]
    assert all(b.images.shape[1:] == (3, 64, 64) for b in batches)



def test_a_file_dali_cannot_read_but_pil_can_gets_a_message_that_says_so(tmp_path):
    """A 1-bit TIFF: DALI's decoder fails the batch (nvImageCodec names no file), PIL reads it."""
    from PIL import Image

    from fastdata import loader

    (tmp_path / "src" / "a").mkdir(parents=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 48, 3), dtype=np.uint8)).convert("1").save(
        tmp_path / "src" / "a" / "bw.tif")
    with pytest.raises(LoaderError, match="though PIL decodes each image of it .*use backend='pil'"):
        list(loader(tmp_path / "src", 1, backend="dali", device="cpu"))
    assert len(list(loader(tmp_path / "src", 1, backend="pil", device="cpu"))) == 1


def test_dali_and_pil_turn_exif_rotated_photos_alike(tmp_path):
    """Both apply EXIF orientation (DALI's adjust_orientation, PIL's exif_transpose): photos from a camera
    held sideways read the same way up from either backend (nvjpeg's turn: tests/gpu)."""
    from fastdata import loader

    from helpers import exif_photos

    exif_photos(tmp_path / "src")
    aug = AugmentConfig(size=32, train=False, crop_fraction=1.0, dtype="float32")
    got = {b: next(iter(loader(tmp_path / "src", 4, backend=b, device="cpu", shuffle=False, augment=aug))).images
           for b in ("dali", "pil")}
    diff = (got["dali"].float() - got["pil"].float()).abs().mean(dim=(1, 2, 3))
    assert diff.max() < 0.3 and diff.max() - diff.min() < 0.05, diff   # filters differ; a turn would be ~1


def test_a_file_name_that_is_not_utf8_is_read_by_the_feed(image_folder, tmp_path):
    """DALI's file reader takes UTF-8 paths only: a Latin-1 name (an old archive's) failed the pipeline's
    build with "Unsupported argument type with name files". Such a folder is now read in Python threads
    (the feed), with every sample and its label."""
    import os
    import shutil

    src = tmp_path / "images"
    shutil.copytree(image_folder, src)
    first = sorted(src.rglob("*.jpg"))[0]
    os.rename(first, os.fsencode(first.parent) + b"/caf\xe9.jpg")
    ref = decode_loader(image_folder, 8, backend="dali", image_size=32, device="cpu", shuffle=False)
    dl = decode_loader(src, 8, backend="dali", image_size=32, device="cpu", shuffle=False)
    assert ref.backend.native and not dl.backend.native
    labels = torch.cat([b.labels for b in dl])
    assert len(labels) == sum(1 for _ in src.rglob("*.jpg"))
    assert sorted(labels.tolist()) == sorted(torch.cat([b.labels for b in ref]).tolist())
