"""The one-call batch gather (fastdata/read/gather.py) returns what the shard-by-shard copy returns."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata.read.fill import fill_batch
from fastdata.read.gather import gather
from fastdata.read.table import ShardTable, TableFull
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
    assert cache.num_shards > 1 and table is not None and not table.mapped   # nothing mapped up front
    idx = np.sort(np.random.default_rng(0).choice(len(cache), 40, replace=False))
    got = _fill(cache, idx, table=True)
    assert table.mapped == set(np.unique(np.searchsorted(cache.starts, idx, side="right") - 1).tolist())
    assert table.rows_per_sample * table.view.shape[1] == int(np.prod(cache.sample_shape))
    want = _fill(open_cache(path), idx, table=False)
    assert torch.equal(got["images"], want["images"]) and torch.equal(got["labels"], want["labels"])
    for k, i in enumerate(idx[:5]):                        # and both are the stored bytes
        data, label = cache.raw(int(i))
        assert torch.equal(got["images"][k].flatten(), data) and int(got["labels"][k]) == label


class _FileShard:
    """The fields ShardTable.add reads, over a real file of equal-size samples."""

    def __init__(self, path, sample_bytes: int, n: int, data_offset: int = 0) -> None:
        payload = np.random.default_rng(n).integers(0, 256, sample_bytes * n, dtype=np.uint8)
        path.write_bytes(b"\0" * data_offset + payload.tobytes())
        self.path, self.data_offset, self.payload = path, data_offset, payload.reshape(n, sample_bytes)
        self.offsets = np.arange(0, sample_bytes * n + 1, sample_bytes, dtype=np.int64)
        self.labels = np.arange(n, dtype=np.int64)
        self.stat = (path.stat().st_size, 0, 0)

    def __len__(self) -> int:
        return len(self.labels)


def _table(shards, sample_bytes):
    return ShardTable([s.stat[0] for s in shards], [len(s) for s in shards], sample_bytes)


def test_table_grows_as_shards_arrive_and_refuses_tiny_rows(tmp_path):
    shards = [_FileShard(tmp_path / f"s{k}", 4096, 3 + k, data_offset=1024 * k) for k in range(3)]
    table = _table(shards, 4096)
    out = np.zeros((4, 4096), np.uint8)
    idx = np.array([0, 3, 5, 11])                   # samples from all three shards
    assert not table.acquire([0, 1, 2])             # none mapped yet
    for i in (2, 0, 1):                             # in any order, as a store delivers them
        table.add(i, shards[i])
    assert table.view.shape[1] == 1024 and table.rows_per_sample == 4
    assert table.acquire([0, 1, 2])
    gather(table, idx, out)
    table.release([0, 1, 2])
    want = np.concatenate([s.payload for s in shards])[idx]
    assert np.array_equal(out, want) and table.labels[idx].tolist() == [0, 0, 2, 4]
    odd = _FileShard(tmp_path / "odd", 27, 10)
    with pytest.raises(TableFull):                  # 27-byte rows: no table, readers copy shard by shard
        _table([odd], 27).add(0, odd)


def test_a_retired_shard_is_unmapped_only_after_the_gather_using_it(tmp_path):
    shards = [_FileShard(tmp_path / f"s{k}", 4096, 4) for k in range(2)]
    table = _table(shards, 4096)
    table.add(0, shards[0]), table.add(1, shards[1])
    assert table.acquire([1])
    table.retire(1)                                 # evicted by the store while a reader gathers from it
    out = np.zeros((2, 4096), np.uint8)
    gather(table, np.array([4, 7]), out)            # still readable
    assert np.array_equal(out, shards[1].payload[[0, 3]]) and 1 in table.mapped
    table.release([1])
    assert 1 not in table.mapped and (table.first_row[4:8] == -1).all() and not table.acquire([1])
    table.retire(0)                                 # not in use: unmapped at once
    assert table.mapped == set()
    table.add(1, shards[1])                         # fetched again: back in its slot
    assert table.acquire([1])


def test_fill_batch_uses_the_table_and_survives_a_pickled_cache(raw_cache):
    import pickle

    cache = pickle.loads(pickle.dumps(open_cache(raw_cache)))   # as a DataLoader worker receives it
    idx = np.arange(0, len(cache), 7)
    got = _fill(cache, idx, table=True)
    assert cache.gather_table() is not None
    want = _fill(open_cache(raw_cache), idx, table=False)
    assert torch.equal(got["images"], want["images"])
