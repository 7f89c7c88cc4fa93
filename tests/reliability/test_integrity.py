"""Damage inside a shard is caught on read (issue #18.6): named by shard and sample, in every mode."""
from __future__ import annotations

import shutil

import pytest

import fastdata
from fastdata.read.dataset import CacheDataset
from fastdata.cache.shardfile import open_shard
from fastdata.errors import CacheFormatError, LoaderError

from helpers import epoch_indices


def _damaged_copy(raw_cache, tmp_path, what: str):
    """A copy of the cache with one pixel byte (sample 3 of shard 0) or one label byte flipped."""
    cache = tmp_path / "c"
    shutil.copytree(raw_cache, cache)
    path = cache / "shard-00000.h5"
    shard = open_shard(path)
    key = shard.keys[3]
    if what == "pixel":
        pos = shard.data_offset + int(shard.offsets[3]) + 100
    else:   # the label array: find sample 3's int64 label in the file
        import h5py

        with h5py.File(path) as f:
            pos = f["labels"].id.get_offset() + 3 * 8
    del shard
    raw = bytearray(path.read_bytes())
    raw[pos] ^= 0x01
    path.write_bytes(bytes(raw))
    return cache, key


@pytest.mark.parametrize("what", ["pixel", "label"])
def test_default_check_names_the_shard_and_stops_the_next_batch(raw_cache, tmp_path, what):
    cache, key = _damaged_copy(raw_cache, tmp_path, what)
    dl = fastdata.loader(cache, 16, device="cpu", shuffle=False)
    with pytest.raises(CacheFormatError, match="shard-00000.h5: sha256 differs from manifest.json") as e:
        it = iter(dl)
        next(it)                     # (on a loaded machine the hash may already be done: then this raises)
        dl.backend.cache._hasher.join()      # the background hash of shard 0 has finished
        list(it)
    assert (f"sample 3 ({key})" in str(e.value)) if what == "pixel" else "its metadata is damaged or it is another file" in str(e.value)


def test_sample_mode_refuses_the_batch_holding_the_damaged_sample(raw_cache, tmp_path):
    cache, key = _damaged_copy(raw_cache, tmp_path, "pixel")
    dl = fastdata.loader(cache, 16, device="cpu", shuffle=False, integrity="sample")
    with pytest.raises(CacheFormatError, match=f"shard-00000.h5 sample 3 \\({key}\\): crc32 mismatch"):
        next(iter(dl))
    ds = CacheDataset(cache, integrity="sample")
    assert ds[2][1] >= 0
    with pytest.raises(CacheFormatError, match="sample 3"):
        ds[3]


def test_off_reads_through_and_bad_mode_is_refused(raw_cache, tmp_path):
    cache, _ = _damaged_copy(raw_cache, tmp_path, "pixel")
    dl = fastdata.loader(cache, 16, device="cpu", integrity="off")
    assert sum(len(b) for b in epoch_indices(dl)) == 120
    with pytest.raises(LoaderError, match="integrity='crc': choose one of shard, sample, off"):
        fastdata.loader(cache, 16, device="cpu", integrity="crc")


def test_intact_cache_passes_every_mode(raw_cache):
    for mode in ("shard", "sample"):
        dl = fastdata.loader(raw_cache, 16, device="cpu", integrity=mode)
        assert sum(len(b) for b in epoch_indices(dl)) == 120
        if mode == "shard":
            dl.backend.cache._hasher.join()
            dl.backend.cache.check_integrity()


def test_a_damaged_sample_beyond_the_first_shard_is_named_as_verify_names_it(image_folder, tmp_path):
    """The loader named a damaged sample by its place in its shard ("sample 17") where `fastdata verify`
    names it by its place in the cache ("sample 49"): one sample, two numbers. Both now give the cache's."""
    from fastdata.cache.verify import verify_cache
    from helpers import build

    cache = tmp_path / "c"
    build(image_folder, cache, shard_size="200KB")
    path = cache / "shard-00001.h5"
    shard = open_shard(path)
    first = len(open_shard(cache / "shard-00000.h5").keys)
    raw = bytearray(path.read_bytes())
    raw[shard.data_offset + int(shard.offsets[2]) + 100] ^= 0x01
    key = shard.keys[2]
    del shard
    path.write_bytes(bytes(raw))
    dl = fastdata.loader(cache, 8, device="cpu", shuffle=False)
    with pytest.raises(CacheFormatError) as e:
        it = iter(dl)
        next(it)
        dl.backend.cache._hasher.join()
        list(it)
    assert f"sample {first + 2} ({key})" in str(e.value)
    assert f"sample {first + 2} ({key})" in verify_cache(cache).text()
