"""CacheDataset: map-style dataset over a cache, for a plain torch DataLoader with workers.

Workers are forked or spawned; the Cache drops its mappings when pickled and
re-maps shards lazily in each worker, so no h5py handle or mmap crosses a
process boundary.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils.data import Dataset

from ..cache.codecs import decode_jpeg_rgb
from .integrity import check_rows
from .reader import Cache, open_cache


class CacheDataset(Dataset):
    """dataset[i] -> (uint8 HWC tensor, label) for images, (uint8 bytes tensor, label) for kind=bytes.

    transform, if given, is applied to the image tensor (e.g. a CPU crop/flip).
    """

    def __init__(self, cache, transform: Callable | None = None, integrity: str = "shard") -> None:
        self.cache = cache if isinstance(cache, Cache) else open_cache(cache, integrity)
        self.transform = transform
        self.kind = self.cache.manifest.kind

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, index: int):
        s, j = self.cache.locate(int(index))
        shard = self.cache.shard(s)
        self.cache.check_integrity()
        data, label = shard.sample(j), int(shard.labels[j])
        if self.cache.integrity == "sample":
            check_rows(data.numpy()[None], shard.crc32[[j]], lambda k: self.cache.sample_name(index))
        if self.kind == "raw":
            image = data.view(*(int(x) for x in shard.shapes[j])).clone()
        elif self.kind == "jpeg":
            image = torch.from_numpy(decode_jpeg_rgb(data.numpy()).copy())
        else:
            image = data.clone()
        if self.transform is not None:
            image = self.transform(image)
        return image, label
