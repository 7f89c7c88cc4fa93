"""EncodedSource.get_batch: the batch read of the decoding backends equals reading sample by sample."""
from __future__ import annotations

import numpy as np
import pytest

from fastdata.read.encoded import EncodedSource


@pytest.mark.parametrize("data", ["jpeg_cache", "image_folder"])
def test_get_batch_equals_get_per_sample(data, request):
    source = EncodedSource(request.getfixturevalue(data))
    n = len(source)
    idx = np.random.default_rng(0).permutation(n)[: min(n, 50)]    # unsorted, across shards
    encoded, labels = source.get_batch(idx)
    assert labels.dtype == np.int64 and len(encoded) == len(idx)
    for k, i in enumerate(idx):
        one, label = source.get(int(i))
        assert labels[k] == label
        assert np.array_equal(encoded[k], one)
    empty, no_labels = source.get_batch(np.zeros(0, np.int64))
    assert empty == [] and len(no_labels) == 0


def test_get_batch_refuses_an_index_past_the_end(jpeg_cache):
    source = EncodedSource(jpeg_cache)
    with pytest.raises(IndexError, match="out of range"):
        source.get_batch(np.array([0, len(source)]))
