"""The on-disk cache format: shards plus one manifest.json. Readers check the version.

A cache directory::

    DEST/
      manifest.json          this file's Manifest, written last and atomically
      shard-00000.h5|.pt     shards, each written as *.tmp, fsynced, renamed
      .build/journal.json    only while a build is unfinished (resume state)
      .build/lock            flock held by the running build

Every shard, whatever its container (HDF5 via h5py, or a torch.save zip
readable with ``torch.load(mmap=True)``), holds the same named arrays::

    +-----------+-----------------+------------------------------------------+
    | name      | dtype, shape    | meaning                                  |
    +-----------+-----------------+------------------------------------------+
    | data      | uint8 [B]       | all samples' bytes, back to back         |
    | offsets   | int64 [n+1]     | sample i is data[offsets[i]:offsets[i+1]]|
    | labels    | int64 [n]       | class index (manifest.label_map)         |
    | shapes    | int32 [n, 3]    | decoded H, W, C (0,0,0 for kind=bytes)   |
    | crc32     | uint32 [n]      | zlib.crc32 of each sample's bytes        |
    | keys      | str [n]         | source path relative to SRC              |
    +-----------+-----------------+------------------------------------------+

``data`` is stored contiguous and uncompressed, so readers memory-map it and a
batch of fixed-shape raw samples is a zero-copy view reshaped to (n, H, W, C).
kind=raw: uint8 HWC pixels; kind=jpeg: JPEG bytes (decode on CPU, nvJPEG or
DALI); kind=bytes: the input files verbatim (any small-file data set).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import CacheFormatError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
KINDS = ("raw", "jpeg", "bytes")
SHARD_FORMATS = ("h5", "pt")
ARRAYS = ("data", "offsets", "labels", "shapes", "crc32", "keys")


def shard_name(index: int, fmt: str) -> str:
    return f"shard-{index:05d}.{fmt}"


@dataclass(frozen=True)
class ShardInfo:
    name: str
    count: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to know without opening a shard."""

    kind: str
    shard_format: str
    num_samples: int
    sample_shape: tuple[int, int, int] | None  # None when shapes vary
    label_map: dict[str, int]
    shards: tuple[ShardInfo, ...]
    quarantined: tuple[dict, ...] = ()
    build: dict = field(default_factory=dict)
    dtype: str = "uint8"
    format_version: int = FORMAT_VERSION

    def to_json(self) -> dict:
        d = asdict(self)
        d["shards"] = [asdict(s) for s in self.shards]
        d["quarantined"] = list(self.quarantined)
        d["sample_shape"] = list(self.sample_shape) if self.sample_shape else None
        return d

    @classmethod
    def from_json(cls, d: dict, where: Path) -> "Manifest":
        version = d.get("format_version")
        if not isinstance(version, int):
            raise CacheFormatError(f"{where}: no format_version; this is not a fastdata manifest")
        if version > FORMAT_VERSION:
            raise CacheFormatError(
                f"{where}: cache format version {version} is newer than this fastdata reads "
                f"({FORMAT_VERSION}); upgrade fastdata (pip install -U fastdata) or rebuild the cache")
        try:
            shape = d["sample_shape"]
            return cls(
                kind=d["kind"], shard_format=d["shard_format"], num_samples=int(d["num_samples"]),
                sample_shape=tuple(shape) if shape else None, label_map=dict(d["label_map"]),
                shards=tuple(ShardInfo(**s) for s in d["shards"]),
                quarantined=tuple(d.get("quarantined", ())), build=dict(d.get("build", {})),
                dtype=d.get("dtype", "uint8"), format_version=version)
        except (KeyError, TypeError, ValueError) as e:
            raise CacheFormatError(f"{where}: manifest is damaged ({e!r}); rebuild the cache") from e


def load_manifest(cache_dir: str | Path) -> Manifest:
    """Read and check DEST/manifest.json; errors name the file and the fix."""
    cache_dir = Path(cache_dir)
    path = cache_dir / MANIFEST
    if not path.is_file():
        hint = " (a build is unfinished: rerun the same build-cache command to resume)" \
            if (cache_dir / ".build" / "journal.json").exists() else \
            " (build one with: fastdata build-cache SRC DEST)"
        raise CacheFormatError(f"{cache_dir}: no {MANIFEST}, so this is not a finished fastdata cache{hint}")
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CacheFormatError(f"{path}: cannot read manifest ({e}); rebuild the cache") from e
    return Manifest.from_json(d, path)
