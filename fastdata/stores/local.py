"""The local shard store: a cache folder on a local file system, or a copy staged into tmpfs.

Every store gives the reader shard i as a local file (the seam the read side
depends on, reader.Cache):

    get(i) -> Path      the shard's file, fetched first if need be (blocks until it is there)
    release(i)          the reader has mapped it: the store may evict the file from now on
    read_ahead(ids)     shards in the order they will be read (a store that fetches starts now)
    evicts, verified    whether files can disappear (mappings stay valid, the gather table is told)
                        and whether the store checked each file's sha256 itself

Here every file is always present, so the hooks do nothing. stores/fetch.py is the object-storage
store (s3:// into a bounded folder); `fastdata stage` / loader(stage=) makes the tmpfs copy.
"""
from __future__ import annotations

from pathlib import Path


class LocalStore:
    evicts = False
    verified = False

    def __init__(self, folder: Path, shards) -> None:
        self.folder, self.names = Path(folder), [s.name for s in shards]

    def get(self, i: int) -> Path:
        return self.folder / self.names[i]

    def release(self, i: int) -> None:
        pass

    def read_ahead(self, ids) -> None:
        pass

    def close(self) -> None:
        pass
