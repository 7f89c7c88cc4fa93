"""The decode processes reading a JPEG cache's shard files themselves (decode_worker.py: rows that name
a file and offset instead of bytes copied into the slot), and the sample index behind a batch's spans."""
from __future__ import annotations

import os

import numpy as np
import pytest

from fastdata.errors import LoaderError
from fastdata.read.backends.decode_pool import MIN_TASK, DecodePool, Slot
from helpers import planar_rgb


@pytest.fixture(scope="module", params=["h5", "pt"])
def shard_cache(request, image_folder, tmp_path_factory):
    """A JPEG cache of several shards in each shard format."""
    from helpers import build

    dest = tmp_path_factory.mktemp(f"direct-{request.param}") / "cache"
    build(image_folder, dest, encode="jpeg", quality=90, shard_size="150KB", workers=2, format=request.param)
    return dest


def test_a_caches_batch_is_read_by_the_processes_from_its_files(shard_cache, pool, monkeypatch):
    """The default for a local cache: the rows name each shard file and offset, no JPEG byte is copied into
    the slot, and the pixels equal those decoded from the bytes copied in (DIRECT_READS off)."""
    from fastdata.read.backends import decode_pool
    from fastdata.read.encoded import EncodedSource

    src = EncodedSource(shard_cache)
    idx = np.random.default_rng(0).permutation(len(src))[:3 * MIN_TASK]
    batch = src.get_spans(np.sort(idx), sizes=True)
    assert batch.files is not None and len(batch.buffers) > 1     # several shards, each a file
    h, w = batch.baseline_sizes()
    got = {}
    for direct in (True, False):
        monkeypatch.setattr(decode_pool, "DIRECT_READS", direct)
        slot = Slot()
        try:
            got[direct] = pool.decode(slot, batch, h, w, str).copy()
            got[direct, "slot"] = slot.size
        finally:
            slot.close()
    assert np.array_equal(got[True], got[False])
    assert np.array_equal(got[True], np.concatenate([planar_rgb(a) for a in batch.arrays()]))
    assert got[True, "slot"] < got[False, "slot"]     # no room for the JPEG bytes


def test_a_shard_rebuilt_under_the_loader_is_an_error_not_other_pixels(shard_cache, tmp_path):
    """A shard file replaced at its path after the loader opened it (another inode) is refused by the
    decode process, which would otherwise decode the new file's bytes at the old offsets."""
    import shutil

    from fastdata.read.encoded import EncodedSource

    copy = tmp_path / "cache"
    shutil.copytree(shard_cache, copy)
    src = EncodedSource(copy)
    batch = src.get_spans(np.arange(MIN_TASK), sizes=True)
    h, w = batch.baseline_sizes()
    path = batch.files[0][0]
    shutil.copyfile(path, path + ".new")
    os.replace(path + ".new", path)          # same bytes, a new file
    p, slot = DecodePool(1), Slot()
    try:
        with pytest.raises(LoaderError, match="changed since the loader opened it.*make a new loader"):
            p.decode(slot, batch, h, w, str)
    finally:
        p.close()
        slot.close()


def test_the_sample_index_gives_the_spans_the_shard_walk_gives(shard_cache):
    """sample_index.py against EncodedSource's shard-by-shard walk: the same bytes, labels and sizes."""
    from fastdata.read.encoded import EncodedSource

    fast, walk = EncodedSource(shard_cache), EncodedSource(shard_cache)
    walk._index = None
    rng = np.random.default_rng(1)
    for n in (1, 7, len(fast)):
        idx = np.sort(rng.permutation(len(fast))[:n])
        a, b = fast.get_spans(idx, sizes=True), walk.get_spans(idx, sizes=True)
        assert [x.tobytes() for x in a.arrays()] == [x.tobytes() for x in b.arrays()]
        assert np.array_equal(a.labels, b.labels) and np.array_equal(a.sizes, b.sizes)
        assert np.array_equal(fast.shard_sizes(0), walk.shard_sizes(0))
    assert np.array_equal(fast.get_spans(idx).labels, fast.labels()[idx])


def test_a_task_that_reads_more_files_than_a_worker_keeps_mapped_still_decodes(shard_cache, monkeypatch):
    """A worker keeps MAX_MAPS files mapped; a batch spread over more shards than that evicts maps
    its own task still reads, which must not fail the batch."""
    from fastdata.read.backends import decode_worker
    from fastdata.read.encoded import EncodedSource

    monkeypatch.setattr(decode_worker, "MAX_MAPS", 1)     # (read by the worker forked below)
    src = EncodedSource(shard_cache)
    batch = src.get_spans(np.arange(len(src)), sizes=True)
    assert len(batch.files) >= 2     # with the slot, three maps for a worker that keeps one
    h, w = batch.baseline_sizes()
    p, slot = DecodePool(1), Slot()
    try:
        flat = p.decode(slot, batch, h, w, str)
        assert np.array_equal(flat, np.concatenate([planar_rgb(a) for a in batch.arrays()]))
    finally:
        p.close()
        slot.close()


def test_a_cache_opened_by_a_relative_path_is_read_after_the_loader_changes_directory(shard_cache, monkeypatch):
    """The decode processes keep the directory they were forked in; the files a task names are absolute."""
    from fastdata.read.encoded import EncodedSource

    p, slot = DecodePool(1), Slot()       # forked here, before the cache is opened
    try:
        monkeypatch.chdir(shard_cache.parent)
        src = EncodedSource(shard_cache.name)
        batch = src.get_spans(np.arange(MIN_TASK), sizes=True)
        assert all(os.path.isabs(f[0]) for f in batch.files)
        monkeypatch.chdir("/")
        h, w = batch.baseline_sizes()
        flat = p.decode(slot, batch, h, w, str)
        assert np.array_equal(flat, np.concatenate([planar_rgb(a) for a in batch.arrays()]))
    finally:
        p.close()
        slot.close()
