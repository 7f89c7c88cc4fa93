"""Shard files as the build writes them (format.py), opened for reading: h5 or pt, mapped, checked.

Both sides need this: verify (write side) and the loaders (read side), so it
lives beside the format it reads. Nothing opened here can run code: .pt
shards load with weights_only and h5 shards holding references or objects
are refused.
"""
from __future__ import annotations

import os
import pickle
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import CacheFormatError
from .format import ShardInfo

_DAMAGED = "run `fastdata verify {cache}` to see which shards are damaged, then rebuild them"

@dataclass
class Shard:
    """One opened shard: flat data plus the small per-sample arrays."""

    path: Path
    data: torch.Tensor        # uint8 [B], memory-mapped
    offsets: np.ndarray       # int64 [n+1]
    labels: np.ndarray        # int64 [n]
    shapes: np.ndarray        # int32 [n, 3]
    crc32: np.ndarray         # uint32 [n]
    keys: list[str]
    stat: tuple[int, int, int] = (0, 0, 0)   # (size, inode, mtime_ns) when opened
    data_offset: int | None = None           # file offset of data[0]: lets readers pread() into pinned memory
    _fd: int | None = None

    def fd(self) -> int:
        """A read-only descriptor for pread (no file position: safe to share between threads)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return self._fd

    def __del__(self) -> None:
        if self._fd is not None:
            os.close(self._fd)

    def __len__(self) -> int:
        return len(self.labels)

    def sample(self, j: int) -> torch.Tensor:
        return self.data[int(self.offsets[j]):int(self.offsets[j + 1])]

    def failing_crc(self) -> list[int]:
        """Samples whose bytes no longer match their stored crc32 (verify and the integrity check)."""
        return [j for j in range(len(self)) if zlib.crc32(self.sample(j).numpy()) != int(self.crc32[j])]

    def block(self, lo: int, hi: int, shape: tuple[int, int, int]) -> torch.Tensor:
        """Fixed-shape samples lo..hi as a zero-copy (n, H, W, C) view."""
        return self.data[int(self.offsets[lo]):int(self.offsets[hi])].view(hi - lo, *shape)


def _open_h5(path: Path) -> Shard:
    import h5py

    # no HDF5 file locking: a shard is immutable once renamed into place (the build holds its own lock),
    # and NFS without lockd (ENOLCK) or Lustre without flock refused every open with "unable to lock file"
    with h5py.File(path, "r", locking=False) as f:
        ds = f["data"]
        if ds.dtype != np.uint8 or h5py.check_string_dtype(f["keys"].dtype) is None:   # references, objects
            raise ValueError(f"data is {ds.dtype}, keys are {f['keys'].dtype}: not a fastdata shard")
        arrays = {k: f[k][()] for k in ("offsets", "labels", "shapes", "crc32")}
        keys = [k.decode("utf-8", "surrogateescape") if isinstance(k, bytes) else str(k) for k in f["keys"][()]]
        offset, n = ds.id.get_offset(), ds.shape[0]
        if n and offset is None:  # chunked or compressed: not written by fastdata, read it whole
            data = torch.from_numpy(ds[()])
        else:
            data = torch.from_numpy(np.memmap(path, np.uint8, "c", offset or 0, (n,))) if n else \
                torch.empty(0, dtype=torch.uint8)
    return Shard(path, data, keys=keys, data_offset=offset, **arrays)


def _pt_data_offset(path: Path, data: torch.Tensor) -> int | None:
    """File offset of the 'data' storage inside a torch.save zip (stored uncompressed), checked."""
    import struct
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            names = [i for i in zf.infolist() if i.filename.endswith("/data/0")]
            if len(names) != 1 or names[0].compress_type != zipfile.ZIP_STORED:
                return None
            info = names[0]
        with open(path, "rb") as f:
            f.seek(info.header_offset)
            header = f.read(30)
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            offset = info.header_offset + 30 + name_len + extra_len
            f.seek(offset)
            head = f.read(min(64, data.numel()))
    except (OSError, zipfile.BadZipFile, struct.error):
        return None
    return offset if head == data[:len(head)].numpy().tobytes() and info.file_size == data.numel() else None


def _open_pt(path: Path) -> Shard:
    obj = torch.load(path, mmap=True, weights_only=True, map_location="cpu")
    return Shard(path, obj["data"], obj["offsets"].numpy(), obj["labels"].numpy(), obj["shapes"].numpy(),
                 obj["crc32"].numpy(), list(obj["keys"]), data_offset=_pt_data_offset(path, obj["data"]))


def open_shard(path: Path, info: ShardInfo | None = None, cache: Path | None = None) -> Shard:
    """Open one shard; a truncated or foreign file gives a CacheFormatError naming it."""
    fix = _DAMAGED.format(cache=cache or path.parent)
    if not path.is_file():
        raise CacheFormatError(f"{path}: shard listed in the manifest is missing; {fix}")
    if info is not None and path.stat().st_size != info.bytes:
        raise CacheFormatError(f"{path}: size {path.stat().st_size} B differs from the manifest's {info.bytes} B "
                               f"(truncated or rewritten); {fix}")
    try:
        shard = _open_h5(path) if path.suffix == ".h5" else _open_pt(path)
    except pickle.UnpicklingError as e:   # weights_only refused a global: a crafted or foreign file
        raise CacheFormatError(f"{path}: refused: this .pt shard asks to unpickle objects that are not "
                               f"tensors, and opening it could run code; rebuild the cache from its source") from e
    except (OSError, RuntimeError, KeyError, ValueError, EOFError, TypeError, AttributeError) as e:
        raise CacheFormatError(f"{path}: cannot open shard ({type(e).__name__}: {e}); {fix}") from e
    _check_dtypes(shard, path, fix)
    st = path.stat()
    shard.stat = (st.st_size, st.st_ino, st.st_mtime_ns)
    if len(shard.offsets) != len(shard) + 1 or (len(shard) and int(shard.offsets[-1]) != shard.data.numel()):
        raise CacheFormatError(f"{path}: offsets do not match data size; {fix}")
    if info is not None and len(shard) != info.count:
        raise CacheFormatError(f"{path}: holds {len(shard)} samples but manifest.json says {info.count}; {fix}")
    return shard


def _check_dtypes(shard: Shard, path: Path, fix: str) -> None:
    """A shard must hold the format's plain arrays (format.py); anything else was not written by us."""
    want = {"data": (shard.data.dtype == torch.uint8 and shard.data.dim() == 1),
            "offsets": shard.offsets.dtype == np.int64, "labels": shard.labels.dtype.kind in "iu",
            "shapes": shard.shapes.dtype.kind in "iu", "crc32": shard.crc32.dtype.kind in "iu",
            "keys": all(isinstance(k, str) for k in shard.keys)}
    bad = [k for k, ok in want.items() if not ok]
    if bad:
        raise CacheFormatError(f"{path}: array(s) {', '.join(bad)} have the wrong type for a fastdata shard; {fix}")
