"""Read side: every loader against a plain reference, determinism, rank split, resume, CPU device."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import fastdata
from fastdata.read.augment import AugmentConfig, augment_batch
from fastdata.read.dataset import CacheDataset
from fastdata.errors import CacheFormatError, LoaderError

from helpers import build, check_resume, epoch_indices


def _reference(cache) -> dict[int, tuple[np.ndarray, int]]:
    ds = CacheDataset(cache)
    return {i: (ds[i][0].numpy(), ds[i][1]) for i in range(len(ds))}


@pytest.mark.parametrize("cache_name,read", [("raw_cache", "mmap"), ("raw_cache", "pread"), ("pt_cache", "mmap"),
                                             ("pt_cache", "pread"), ("jpeg_cache", "mmap")])
def test_loader_matches_reference_pixels_and_samples(cache_name, read, request):
    cache = request.getfixturevalue(cache_name)
    ref = _reference(cache)
    got = {}
    for b in fastdata.loader(cache, 16, device="cpu", seed=3, read=read):
        for img, lab, idx in zip(b.images, b.labels, b.indices.tolist()):
            assert idx not in got
            got[idx] = (img.numpy(), int(lab))
        assert b.images.dtype == torch.uint8 and b.labels.dtype == torch.int64
    assert sorted(got) == sorted(ref)
    for i in ref:
        assert got[i][1] == ref[i][1] and np.array_equal(got[i][0], ref[i][0])


def test_order_is_deterministic_per_seed_and_changes_per_epoch(raw_cache):
    a = epoch_indices(fastdata.loader(raw_cache, 10, device="cpu", seed=1))
    b = epoch_indices(fastdata.loader(raw_cache, 10, device="cpu", seed=1))
    c = epoch_indices(fastdata.loader(raw_cache, 10, device="cpu", seed=2))
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert [x.tolist() for x in a] != [x.tolist() for x in c]
    dl = fastdata.loader(raw_cache, 10, device="cpu", seed=1)
    e0, e1 = epoch_indices(dl), epoch_indices(dl)
    assert [x.tolist() for x in e0] != [x.tolist() for x in e1]
    assert sorted(np.concatenate(e0)) == sorted(np.concatenate(e1)) == list(range(120))


def test_shuffle_is_shard_aware_and_off_means_sequential(raw_cache):
    seq = np.concatenate(epoch_indices(fastdata.loader(raw_cache, 7, device="cpu", shuffle=False)))
    assert seq.tolist() == list(range(120))
    dl = fastdata.loader(raw_cache, 8, device="cpu", window=24)
    starts = dl.backend.cache.starts
    for b in dl:  # with a window of 24 samples (~2 shards of 12), a batch spans few shards
        shards = np.unique(np.searchsorted(starts, b.indices.numpy(), side="right"))
        assert len(shards) <= 3


@pytest.mark.parametrize("world", [2, 3, 7])
def test_rank_split_disjoint_complete_equal(raw_cache, world):
    per_rank = [np.concatenate(epoch_indices(fastdata.loader(raw_cache, 8, device="cpu", seed=5, rank=r,
                                                            world_size=world))) for r in range(world)]
    lens = {len(p) for p in per_rank}
    assert lens == {120 // world}
    batches = {len(fastdata.loader(raw_cache, 8, device="cpu", rank=r, world_size=world)) for r in range(world)}
    assert len(batches) == 1
    joined = np.concatenate(per_rank)
    assert len(np.unique(joined)) == len(joined) == 120 - 120 % world


def test_too_many_ranks_is_a_clear_error(raw_cache):
    with pytest.raises(LoaderError, match="would get no data"):
        list(fastdata.loader(raw_cache, 8, device="cpu", rank=0, world_size=500))


@pytest.mark.parametrize("stop_after", [1, 4, 14])
def test_resume_mid_epoch_is_exact(raw_cache, stop_after):
    check_resume(lambda: fastdata.loader(raw_cache, 8, device="cpu", seed=9), stop_after)


def test_resume_in_second_epoch_and_drop_last(raw_cache):
    def make():
        dl = fastdata.loader(raw_cache, 16, device="cpu", seed=4, drop_last=True)
        list(dl)  # finish epoch 0 so the resume lands in epoch 1
        return dl
    check_resume(make, 3)
    assert all(len(b.indices) == 16 for b in fastdata.loader(raw_cache, 16, device="cpu", drop_last=True))


def test_reads_ahead_across_epochs_without_changing_what_is_seen(raw_cache):
    """One loader run for three epochs (reading ahead into each next epoch) yields what three fresh
    loaders restored at each epoch start yield, pixels included."""
    ref = _reference(raw_cache)
    dl = fastdata.loader(raw_cache, 16, device="cpu", seed=6, prefetch=3)
    for epoch in range(3):
        got = [(b.indices.numpy().copy(), b.images.numpy().copy()) for b in dl]
        fresh = fastdata.loader(raw_cache, 16, device="cpu", seed=6)
        fresh.load_state_dict({"order": {"epoch": epoch, "position": 0, "seed": 6, "world_size": 1, "rank": 0},
                               "coverage": fastdata.loader(raw_cache, 16, device="cpu").state_dict()["coverage"]})
        assert [i.tolist() for i, _ in got] == [i.tolist() for i in epoch_indices(fresh)]
        for idx, images in got:
            assert all(np.array_equal(img, ref[int(i)][0]) for i, img in zip(idx, images))
        assert dl.coverage()["seen"] == 120 and dl.coverage()["repeated"] == 0


def test_left_early_then_restored_elsewhere_drops_reads_made_ahead(raw_cache):
    dl = fastdata.loader(raw_cache, 8, device="cpu", seed=2, prefetch=4)
    ref = fastdata.loader(raw_cache, 8, device="cpu", seed=2)
    full, second_epoch = epoch_indices(ref), epoch_indices(ref)
    it = iter(dl)
    first = [next(it).indices.numpy().copy() for _ in range(3)]
    state = dl.state_dict()
    del it
    more = next(iter(dl)).indices.numpy().copy()      # as with DataLoader, a new iter() is a fresh pass
    assert [x.tolist() for x in first] == [x.tolist() for x in full[:3]]
    assert more.tolist() == second_epoch[0].tolist()
    dl.load_state_dict(state)                          # back to batch 3: the reads made ahead are stale
    assert [x.tolist() for x in epoch_indices(dl)] == [x.tolist() for x in full[3:]]


def test_a_second_live_iterator_is_refused(raw_cache):
    dl = fastdata.loader(raw_cache, 8, device="cpu")
    a = iter(dl)
    next(a)
    next(iter(dl))
    with pytest.raises(LoaderError, match="another iteration"):
        next(a)


def test_coverage_reports_missed_and_repeated(raw_cache):
    dl = fastdata.loader(raw_cache, 16, device="cpu")
    for k, _ in enumerate(dl):
        if k == 2:
            break
    cov = dl.coverage()
    assert cov == {"epoch": 0, "samples": 120, "seen": 48, "repeated": 0, "missed": 72}


def test_augment_on_cpu_shapes_determinism_and_eval_center(raw_cache):
    aug = AugmentConfig(size=32, dtype="bfloat16")
    a = [b.images for b in fastdata.loader(raw_cache, 16, device="cpu", seed=1, augment=aug)]
    b = [b.images for b in fastdata.loader(raw_cache, 16, device="cpu", seed=1, augment=aug)]
    assert a[0].shape == (16, 3, 32, 32) and a[0].dtype == torch.bfloat16
    assert a[0].is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    # eval: centre crop of the full frame with crop_fraction 1 reproduces a plain resize
    img = torch.arange(4 * 4 * 3, dtype=torch.uint8).view(1, 4, 4, 3)
    cfg = AugmentConfig(size=4, train=False, crop_fraction=1.0, mean=(0, 0, 0), std=(1 / 255,) * 3)
    out = augment_batch(img, cfg)
    assert torch.allclose(out[0].permute(1, 2, 0), img[0].float(), atol=1e-3)


def test_augment_flip_and_full_crop_match_reference():
    img = torch.randint(0, 255, (2, 8, 8, 3), dtype=torch.uint8)
    cfg = AugmentConfig(size=8, scale=(1.0, 1.0), ratio=(1.0, 1.0), mean=(0, 0, 0), std=(1 / 255,) * 3)
    out = augment_batch(img, cfg, torch.Generator().manual_seed(0)).permute(0, 2, 3, 1)
    for k in range(2):
        same = torch.allclose(out[k], img[k].float(), atol=1e-3)
        flipped = torch.allclose(out[k], img[k].flip(1).float(), atol=1e-3)
        assert same or flipped


def test_fused_augment_equals_eager_including_a_partial_batch():
    img = torch.randint(0, 255, (12, 40, 40, 3), dtype=torch.uint8)
    for n in (12, 5):   # a last partial batch reuses the compiled kernel (dynamic shapes)
        eager = augment_batch(img[:n], AugmentConfig(size=24), torch.Generator().manual_seed(3))
        fused = augment_batch(img[:n], AugmentConfig(size=24, fused=True), torch.Generator().manual_seed(3))
        assert fused.shape == eager.shape == (n, 3, 24, 24)
        assert fused.is_contiguous(memory_format=torch.channels_last)
        assert torch.allclose(fused, eager, atol=1e-3)


def test_run_loader_passes_kernel_and_dtype_to_the_cache_loader(raw_cache):
    from fastdata.cli.assemble import RunConfig, build_loader
    from fastdata.engine.config import EngineConfig

    for kernel in ("eager", "compiled"):
        run = RunConfig(data=str(raw_cache), image_size=32, kernel=kernel, engine=EngineConfig(precision="bf16"))
        dl = build_loader(run, 8, "cpu", 0, 1)
        assert dl.cfg.backend == "raw" and dl.cfg.augment.kernel == kernel and dl.cfg.augment.size == 32
        assert next(iter(dl)).images.dtype == torch.bfloat16


def test_cache_dataset_in_plain_dataloader_with_workers(raw_cache):
    ref = _reference(raw_cache)
    dl = DataLoader(CacheDataset(raw_cache), batch_size=10, num_workers=2, shuffle=False)
    k = 0
    for images, labels in dl:
        for img, lab in zip(images, labels):
            assert np.array_equal(img.numpy(), ref[k][0]) and int(lab) == ref[k][1]
            k += 1
    assert k == 120


def test_variable_shapes_need_a_crop_and_bad_args_are_refused(image_folder, tmp_path):
    from helpers import build

    build(image_folder, tmp_path / "v", resize="short", workers=0)
    with pytest.raises(LoaderError, match="different sizes .* pass augment=True"):
        fastdata.loader(tmp_path / "v", 8, device="cpu")
    assert CacheDataset(tmp_path / "v")[0][0].shape[2] == 3
    from fastdata.read.order import SampleOrder, OrderConfig

    with pytest.raises(LoaderError, match="positive batch size"):
        SampleOrder([10], 0, OrderConfig())


def test_cache_replaced_under_running_loader_is_detected(image_folder, tmp_path):
    from helpers import build

    dest = tmp_path / "c"
    build(image_folder, dest, workers=0)
    dl = fastdata.loader(dest, 8, device="cpu", shuffle=False, prefetch=1, threads=1)
    it = iter(dl)
    next(it)
    dl.backend.cache.shard(dl.backend.cache.num_shards - 1)  # mapped now, read at the end of the epoch
    shard = dest / dl.backend.cache.manifest.shards[-1].name
    data = shard.read_bytes()
    shard.unlink()
    shard.write_bytes(data)  # same bytes, new file: a rebuild in place
    with pytest.raises(CacheFormatError, match="changed on disk"):
        for _ in it:
            pass


def test_a_shard_evicted_by_its_store_is_not_a_change_on_disk(raw_cache, tmp_path):
    """An evicting shard folder (object storage) unlinks a file before it tells the cache; a check
    in between must not call that a rebuilt cache (it failed a CI run)."""
    import shutil

    from fastdata.read.reader import open_cache

    copy = tmp_path / "c"
    shutil.copytree(raw_cache, copy)
    cache = open_cache(copy)
    shard = cache.shard(0)
    shard.path.unlink()                      # the eviction, before its listener has run
    with pytest.raises(CacheFormatError, match="changed on disk"):
        cache.check_unchanged([0])           # a local cache: a file gone under a reader is an error

    class Evicting:
        evicts = True

    cache.store = Evicting()
    cache.check_unchanged([0])               # an evicting store's own file: not a change
    assert cache.shard(0) is shard and shard.sample(0).shape == shard.sample(1).shape   # the mapping reads on


def test_unknown_read_mode_is_refused(raw_cache):
    with pytest.raises(LoaderError, match="choose mmap or pread"):
        fastdata.loader(raw_cache, 8, device="cpu", read="o_direct")


def test_resume_state_from_other_settings_is_refused(raw_cache):
    a = fastdata.loader(raw_cache, 8, device="cpu", seed=1)
    b = fastdata.loader(raw_cache, 8, device="cpu", seed=2)
    with pytest.raises(LoaderError, match="seed"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(LoaderError, match="shuffle"):
        fastdata.loader(raw_cache, 8, device="cpu", seed=1, shuffle=False).load_state_dict(a.state_dict())


def test_resume_state_saved_for_other_data_is_refused(raw_cache, image_folder, tmp_path):
    """The order depends on the shard sizes: a state of another cache (same settings) would resume
    another order silently. A state from before these keys were saved still loads."""
    build(image_folder, tmp_path / "small", shard_size="200KB")
    raw = fastdata.loader(raw_cache, 8, device="cpu", seed=1)
    other = fastdata.loader(tmp_path / "small", 8, device="cpu", seed=1)
    assert raw.backend.shard_counts != other.backend.shard_counts
    with pytest.raises(LoaderError, match="samples in .* shards but this loader reads"):
        other.load_state_dict(raw.state_dict())
    old = raw.state_dict()
    for k in ("samples", "shards", "shuffle"):
        del old["order"][k]
    raw.load_state_dict(old)
    assert sum(1 for _ in raw) == len(raw)


def test_batch_size_must_be_a_whole_number(raw_cache):
    for bad in (4.0, "4", True):
        with pytest.raises(LoaderError, match=f"batch_size={bad!r}: give a whole number"):
            fastdata.loader(raw_cache, bad, device="cpu")
    assert fastdata.loader(raw_cache, np.int64(8), device="cpu").cfg.batch_size == 8


def test_a_bytes_cache_is_pointed_to_cachedataset_by_every_backend(image_folder, tmp_path):
    """Each backend used to send the user to the other ("read it with backend raw" / "use pil")."""
    from helpers import build

    build(image_folder, tmp_path / "b", workers=0, encode="bytes")
    for backend in ("auto", "pil", "raw"):
        with pytest.raises(LoaderError, match="CacheDataset"):
            fastdata.loader(tmp_path / "b", 4, device="cpu", backend=backend)
    data, label = CacheDataset(tmp_path / "b")[0]
    assert data.dtype == torch.uint8 and bytes(data[:2].tolist()) == b"\xff\xd8"


@pytest.mark.parametrize("kw,needle", [
    (dict(size=0), "size=0: give 1..8192 pixels"),
    (dict(scale=(0.9, 0.1)), "scale=(0.9, 0.1): give (lo, hi) with 0 < lo <= hi <= 1"),
    (dict(ratio=(2, 1)), "ratio=(2, 1): give (lo, hi)"),
    (dict(std=(0, 0, 0)), "every value must be > 0"),
    (dict(mean=(1, 2)), "give 3 values each"),
    (dict(dtype="float64"), "dtype='float64': choose one of float32, bfloat16, float16"),
    (dict(crop_fraction=0), "crop_fraction=0: give a fraction in (0, 1]"),
])
def test_bad_augment_settings_are_named_when_made(kw, needle):
    """Each used to surface later: a reader-thread ValueError, a reduction error, or NaN batches (std 0)."""
    with pytest.raises(LoaderError, match=re.escape(needle)):
        AugmentConfig(**kw)
    assert AugmentConfig(size=np.int64(32)).size == 32


def test_rank_world_and_seed_arguments_are_checked(raw_cache, monkeypatch):
    """world_size=2 without a rank read rank 0's share in every process; world_size=0 was taken as 1; a
    negative seed (torch.manual_seed takes one) raised numpy's ValueError."""
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(LoaderError, match="world_size=2 without rank=: give each process its rank"):
        fastdata.loader(raw_cache, 8, device="cpu", world_size=2)
    with pytest.raises(LoaderError, match="world_size=0: give 1 or more"):
        fastdata.loader(raw_cache, 8, device="cpu", world_size=0)
    with pytest.raises(LoaderError, match="seed=1.5: give an integer"):
        fastdata.loader(raw_cache, 8, device="cpu", seed=1.5)
    monkeypatch.setenv("RANK", "1")      # torchrun's variable supplies the missing rank
    from_env = np.concatenate(epoch_indices(fastdata.loader(raw_cache, 8, device="cpu", world_size=2)))
    explicit = np.concatenate(epoch_indices(fastdata.loader(raw_cache, 8, device="cpu", world_size=2, rank=1)))
    assert np.array_equal(from_env, explicit) and len(from_env) == 60
    monkeypatch.delenv("RANK")
    a = np.concatenate(epoch_indices(fastdata.loader(raw_cache, 8, device="cpu", seed=-5)))
    b = np.concatenate(epoch_indices(fastdata.loader(raw_cache, 8, device="cpu", seed=2**64 - 5)))
    assert np.array_equal(a, b) and sorted(a.tolist()) == list(range(120))


def test_a_folder_with_pngs_is_not_sent_to_nvjpeg(tmp_path):
    """nvJPEG reads JPEGs only: auto on a GPU without DALI chose nvjpeg for a PNG folder (CIFAR's) and its
    first batch failed. Checked on the config, which needs no GPU."""
    from fastdata.read.config import LoaderConfig, NvjpegOptions
    from fastdata.read.encoded import EncodedSource
    from fastdata.read.verbs import _decodable_backend

    from helpers import noise_folder

    source = EncodedSource(noise_folder(tmp_path / "png", ext="png"))
    cfg = LoaderConfig(batch_size=4, backend="nvjpeg", augment=AugmentConfig(size=32), options=NvjpegOptions())
    assert _decodable_backend(source, cfg, "auto").backend == "pil"
    with pytest.raises(LoaderError, match=r"6 file\(s\) backend nvjpeg cannot decode \(not JPEG\)"):
        _decodable_backend(source, cfg, "nvjpeg")
    jpegs = EncodedSource(noise_folder(tmp_path / "jpg"))
    assert _decodable_backend(jpegs, cfg, "auto") is cfg


@pytest.mark.parametrize("lanes", [0, -1, 1.5, True, "2"])
def test_nvjpeg_lanes_must_be_a_whole_number_of_threads(lanes, tmp_path):
    """lanes (GPU threads of backend nvjpeg) is checked with the config, before any GPU is needed."""
    from fastdata.read.config import LoaderConfig, NvjpegOptions

    with pytest.raises(LoaderError, match=rf"NvjpegOptions\(lanes={re.escape(repr(lanes))}\): give a whole number"):
        LoaderConfig(batch_size=4, backend="nvjpeg", options=NvjpegOptions(lanes=lanes)).check()
    assert LoaderConfig(batch_size=4, backend="nvjpeg", options=NvjpegOptions(lanes=3)).check().options.lanes == 3
