"""The one-call batch gather (fastdata/read/gather.py) returns what the shard-by-shard copy returns."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata.read.fill import fill_batch
from fastdata.read.gather import build_table, gather
from fastdata.read.reader import open_cache


def _fill(cache, idx, table: bool):
    slot = {"images": torch.zeros((len(idx), *cache.sample_shape), dtype=torch.uint8),
            "labels": torch.full((len(idx),), -1, dtype=torch.int64)}
    if not table:
        cache.gather_table = lambda: None      # force the shard-by-shard path
    fill_batch(cache, idx, slot)
    return slot


@pytest.mark.parametrize("fixture", ["raw_cache", "pt_cache"])
def test_table_gather_equals_shard_by_shard_copy(fixture, request):
    path = request.getfixturevalue(fixture)
    cache = open_cache(path)
    table = cache.gather_table()
    assert cache.num_shards > 1 and table is not None     # batches below cross shard boundaries
    assert table.rows_per_sample * table.view.shape[1] == int(np.prod(cache.sample_shape))
    idx = np.sort(np.random.default_rng(0).choice(len(cache), 40, replace=False))
    got = _fill(cache, idx, table=True)
    want = _fill(open_cache(path), idx, table=False)
    assert torch.equal(got["images"], want["images"]) and torch.equal(got["labels"], want["labels"])
    for k, i in enumerate(idx[:5]):                        # and both are the stored bytes
        data, label = cache.raw(int(i))
        assert torch.equal(got["images"][k].flatten(), data) and int(got["labels"][k]) == label


class _FileShard:
    """The fields build_table reads, over a real file of equal-size samples."""

    def __init__(self, path, sample_bytes: int, n: int, data_offset: int = 0) -> None:
        payload = np.random.default_rng(n).integers(0, 256, sample_bytes * n, dtype=np.uint8)
        path.write_bytes(b"\0" * data_offset + payload.tobytes())
        self.path, self.data_offset, self.payload = path, data_offset, payload.reshape(n, sample_bytes)
        self.offsets = np.arange(0, sample_bytes * n + 1, sample_bytes, dtype=np.int64)
        self.labels = np.arange(n, dtype=np.int64)
        self.stat = (path.stat().st_size, 0, 0)

    def __len__(self) -> int:
        return len(self.labels)


def test_table_over_files_back_to_back_and_none_where_rows_would_be_tiny(tmp_path):
    shards = [_FileShard(tmp_path / f"s{k}", 4096, 3 + k, data_offset=1024 * k) for k in range(3)]
    table = build_table(shards, 4096)
    assert table is not None and table.view.shape[1] == 1024 and table.rows_per_sample == 4
    out = np.zeros((4, 4096), np.uint8)
    idx = np.array([0, 3, 5, 11])                   # samples from all three shards
    gather(table, idx, out)
    want = np.concatenate([s.payload for s in shards])[idx]
    assert np.array_equal(out, want) and table.labels[idx].tolist() == [0, 0, 2, 4]
    assert build_table([_FileShard(tmp_path / "odd", 27, 10)], 27) is None   # 27-byte rows: no table
    assert build_table([], 27) is None


def test_fill_batch_uses_the_table_and_survives_a_pickled_cache(raw_cache):
    import pickle

    cache = pickle.loads(pickle.dumps(open_cache(raw_cache)))   # as a DataLoader worker receives it
    idx = np.arange(0, len(cache), 7)
    got = _fill(cache, idx, table=True)
    assert cache.gather_table() is not None
    want = _fill(open_cache(raw_cache), idx, table=False)
    assert torch.equal(got["images"], want["images"])
