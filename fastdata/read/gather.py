"""One GIL release per batch: gather fixed-size samples from every mapped shard with a single numpy.take.

Why: a reader thread gives up the GIL inside each copy and must win it back
afterwards. Copying shard by shard, a batch drawn from a 16k-sample shuffle
window touches dozens of shards, so dozens of times per batch; when the
training thread is busy in Python (an eager step launching kernels), each
win-back waits up to the interpreter's switch interval (5 ms). On the 2-core
box, beside a main thread looping in Python, one reader gathered 426 img/s
shard by shard and 9.9k img/s with this table (10k x 224 px cache, 64
shards); alone, 8 readers on the 16-core H200 machine went from 11k to 155k
img/s delivered to the GPU.

How (table.py builds it): every shard file is memory-mapped once more, back
to back, inside one address range reserved for them alone (an anonymous PROT_NONE mapping,
then each file mapped over its part with MAP_FIXED), so every sample is
bytes at a fixed address inside that range and nothing else lives there.
The range is viewed as a 2-D uint8 array of rows of ``granule`` bytes, where
``granule`` divides the sample size and every sample's offset in the range
(h5 data sit at one offset in every shard, which gave 1 KiB rows for 224 px
samples; .pt storages are 64-byte aligned). A batch is then
``rows_per_sample`` consecutive row numbers per sample, and one numpy.take
(GIL released, on this thread only) copies them all into the slot. Gathering
256 x 224 px samples on one thread of the 2-core box: 58k img/s with 1 KiB
rows, 48k with 64 B rows.

Why a range of its own: numpy.take copies its output first when the output's
address lies between the source's first and last byte (a bounds test), so a
view spanning the loader's ordinary shard mappings made every batch whose
slot had been allocated between two shards pay an extra 38 MB copy (the
loader fell from 19k to 5k img/s on the 2-core box). Where the range cannot
be made (not Linux, a shard whose data offset is unknown, rows under 64 B)
there is no table and the reader copies shard by shard instead.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

MIN_GRANULE = 64        # bytes; the smallest rows measured (2-core box, 150 KB samples) still copy fast


class _Range:
    """Exposes [addr, addr + rows * granule) as an array through the array interface, without copying."""

    def __init__(self, addr: int, rows: int, granule: int) -> None:
        self.__array_interface__ = {"shape": (rows, granule), "strides": (granule, 1), "typestr": "|u1",
                                    "data": (addr, True), "version": 3}


# Linux mmap(2) constants (the mmap module does not export MAP_FIXED)
_PROT_NONE, _PROT_READ, _MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANON, _MAP_NORESERVE = 0, 1, 1, 2, 0x10, 0x20, 0x4000


@functools.lru_cache(maxsize=1)
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def madvise(address: int, size: int, advice: int) -> bool:
    """madvise(2) over [address, address + size): whether the kernel took the advice."""
    return _libc().madvise(address, size, advice) == 0


def advise_mapping(m, size: int, advice: int) -> bool:
    """madvise(2) over the first size bytes of Python mapping m (an mmap.mmap): its address through a
    numpy view, let go before return so that m can still be closed."""
    view = np.frombuffer(m, dtype=np.uint8)
    try:
        return madvise(view.ctypes.data, size, advice)
    finally:
        del view


def gather(table, idx: np.ndarray, images: np.ndarray) -> None:
    """Copy samples idx (global indices) into images[:len(idx)] (a C-contiguous uint8 array) in one call."""
    if not images.flags.c_contiguous:   # a reshape below would copy, and the gather would be lost
        raise ValueError("gather needs a C-contiguous output array")
    view, first_row, _, rows_per_sample = table.grid   # one consistent snapshot (table.py)
    rows = (first_row[idx][:, None] + np.arange(rows_per_sample)).ravel()
    # mode="clip" writes straight into `images` (mode="raise" buffers a copy); the caller pinned every
    # shard of idx in the table, so every row number above is a mapped sample's
    np.take(view, rows, axis=0, out=images[:len(idx)].reshape(len(rows), -1), mode="clip")
