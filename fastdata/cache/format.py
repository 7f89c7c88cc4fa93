"""The on-disk cache format: shards plus one manifest.json. Readers check the version.

A cache directory::

    DEST/
      manifest.json          this file's Manifest, written last and atomically, with the sha256 of
                           its own canonical JSON (checked on every open: a damaged manifest
                           must not make verify blame an intact shard)
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

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .._util import refuse_url, user_path
from ..errors import CacheFormatError

FORMAT_VERSION = 2       # 2: manifest_sha256 and checked counts; version 1 caches are still read
MANIFEST = "manifest.json"
KINDS = ("raw", "jpeg", "bytes")
SHARD_FORMATS = ("h5", "pt")


def is_manifest(path: str | Path) -> bool:
    """path (a folder's manifest.json) is fastdata's, damaged or not: it names format_version (in its first
    MB: keys are sorted), or shards lie beside it. Another tool's manifest.json (a labelling export
    inside a class folder) is not: such a folder was taken for a cache and skipped, its images lost and
    every later class's label moved down by one."""
    p = Path(path)
    if not p.is_file():
        return False
    try:
        with open(p, "rb") as f:
            if b'"format_version"' in f.read(1 << 20):
                return True
        return any(_SHARD_NAME.match(name) for name in os.listdir(p.parent))
    except OSError:   # unreadable: taken as ours, so that reading it names the file and the problem
        return True


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
        d["manifest_sha256"] = canonical_sha256(d)
        return d

    @classmethod
    def from_json(cls, d: dict, where: Path) -> "Manifest":
        version = d.get("format_version") if isinstance(d, dict) else None
        if not isinstance(version, int):
            raise CacheFormatError(f"{where}: no format_version; this is not a fastdata manifest")
        if version > FORMAT_VERSION:
            raise CacheFormatError(
                f"{where}: cache format version {version} is newer than this fastdata reads "
                f"({FORMAT_VERSION}); upgrade fastdata (pip install -U fastdata) or rebuild the cache")
        _check_sum(d, version, where)
        try:
            shape = d["sample_shape"]
            m = cls(
                kind=d["kind"], shard_format=d["shard_format"], num_samples=int(d["num_samples"]),
                sample_shape=tuple(shape) if shape else None, label_map=dict(d["label_map"]),
                shards=tuple(ShardInfo(**s) for s in d["shards"]),
                quarantined=tuple(d.get("quarantined", ())), build=dict(d.get("build", {})),
                dtype=d.get("dtype", "uint8"), format_version=version)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CacheFormatError(f"{where}: manifest is damaged ({e!r}); rebuild the cache") from e
        _check_consistent(m, where)
        return m


def canonical_sha256(d: dict) -> str:
    """sha256 of the manifest's canonical JSON, without its own checksum field."""
    body = {k: v for k, v in d.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _check_sum(d: dict, version: int, where: Path) -> None:
    if "manifest_sha256" not in d and version < 2:
        return   # written before manifests carried a checksum
    if d.get("manifest_sha256") != canonical_sha256(d):
        raise CacheFormatError(f"{where}: the manifest does not match its own checksum (it was edited or "
                               f"damaged), so its shard list cannot be trusted; restore {MANIFEST} from a copy "
                               f"or rebuild the cache")


_SHARD_NAME = re.compile(r"^shard-\d{5,}\.(h5|pt)$")


def _check_consistent(m: Manifest, where: Path) -> None:
    """Cross-checks that hold for every manifest fastdata writes (a foreign or hand-made one included)."""
    names = [s.name for s in m.shards]
    problems = [
        (m.kind in KINDS, f"kind {m.kind!r}"),
        (m.shard_format in SHARD_FORMATS, f"shard_format {m.shard_format!r}"),
        (all(_SHARD_NAME.match(n) for n in names) and len(set(names)) == len(names), "shard names"),
        (all(isinstance(s.count, int) and s.count > 0 and s.bytes > 0 for s in m.shards), "shard counts"),
        (m.num_samples == sum(s.count for s in m.shards), f"num_samples {m.num_samples} != the shards' sum"),
        (m.sample_shape is None or (len(m.sample_shape) == 3 and all(isinstance(x, int) and x > 0
                                                                   for x in m.sample_shape)), "sample_shape"),
    ]
    bad = [what for ok, what in problems if not ok]
    if bad:
        raise CacheFormatError(f"{where}: manifest is inconsistent ({'; '.join(bad)}); rebuild the cache")


def load_manifest(cache_dir: str | Path, storage_options: dict | None = None) -> Manifest:
    """Read and check DEST/manifest.json (or s3://.../manifest.json); errors name the file and the fix."""
    if str(cache_dir).startswith("s3://"):
        from ..stores.fetch import fetch_manifest

        return Manifest.from_json(fetch_manifest(str(cache_dir), storage_options),
                                  f"{str(cache_dir).rstrip('/')}/{MANIFEST}")
    refuse_url(cache_dir, "cache")
    cache_dir = Path(user_path(cache_dir))
    path = cache_dir / MANIFEST
    if not cache_dir.exists():
        raise CacheFormatError(f"{cache_dir} does not exist; give the folder build-cache wrote (its DEST)")
    if not path.is_file():
        hint = " (a build is unfinished: rerun the same build-cache command to resume)" \
            if (cache_dir / ".build" / "journal.json").exists() else \
            " (build one with: fastdata build-cache SRC DEST)"
        raise CacheFormatError(f"{cache_dir}: no {MANIFEST}, so this is not a finished fastdata cache{hint}")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:   # ValueError: bad JSON and bytes that are not UTF-8
        raise CacheFormatError(f"{path}: cannot read manifest ({e}); rebuild the cache") from e
    return Manifest.from_json(d, path)
