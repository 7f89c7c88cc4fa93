"""A decode process of decode_pool.DecodePool: its task messages, the files it maps, the decode.

A task is one message: a head (task_head: the slot's size and path, then each cache file its rows read,
with its size and inode), then int64 rows (source, start, length, out offset, height, width), 8-aligned.
Source 0 is the slot (JPEG bytes the loader copied in), k > 0 the head's k-th file. The answer is empty,
or "row\nwhy" for the first image that failed (row -1: no image's fault). A worker touches neither CUDA
nor torch.
"""
from __future__ import annotations

import mmap
import os
import signal
import struct

import numpy as np
from PIL import Image

from .cpu_share import planes_at_size

_HEAD = struct.Struct("<QII")   # a task's head: its slot's size, the length of its path, the files it names; the path
_FILE = struct.Struct("<QQI")   # a file the rows read from: its size, inode and the length of its path; the path
_MAPS: dict[str, tuple[int, mmap.mmap]] = {}    # the slots and cache files this worker has mapped, by path
MAX_MAPS = 256


def task_head(slot_path: str, slot_size: int, files: list[tuple[str, int, int, int]]) -> bytes:
    """Loader: a task's head: its slot, then each file its rows read (path, size and inode: checked here)."""
    path = slot_path.encode()
    parts = [_HEAD.pack(slot_size, len(path), len(files)), path]
    for name, _, size, inode in files:
        name = name.encode()
        parts += [_FILE.pack(size, inode, len(name)), name]
    head = b"".join(parts)
    return head + bytes(-len(head) % 8)     # the rows start 8-aligned


def _worker_init(nice: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the loader's to handle, not 16 tracebacks
    if nice > 0:
        try:
            os.nice(nice)
        except OSError:     # a lower priority is always allowed; a sandbox that forbids it costs only the priority
            pass


def _mapped(path: str, size: int, inode: int | None = None) -> np.ndarray:
    """Worker: a slot's bytes (writable), or a cache file's (read-only, inode checked: a cache rebuilt
    under the loader is a new file at the same path), mapped once per file."""
    got = _MAPS.get(path)
    if got is None or got[0] != size:
        while len(_MAPS) >= MAX_MAPS:
            try:
                _MAPS.pop(next(iter(_MAPS)))[1].close()
            except BufferError:     # this task still reads it (a batch of more files than MAX_MAPS):
                pass                # unmapped once the task's view of it goes
        with open(path, "rb" if inode else "r+b") as f:
            st = os.fstat(f.fileno())
            if inode and (st.st_ino, st.st_size) != (inode, size):
                raise _Changed(f"{path} changed since the loader opened it")
            got = _MAPS[path] = (size, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ if inode else
                                                 mmap.ACCESS_WRITE))
    return np.frombuffer(got[1], dtype=np.uint8)


class _Changed(Exception):
    """A cache file is not the one the loader mapped."""


def decode_task(msg: bytes) -> tuple[int, str] | None:
    """Worker: decode each image of a task (int64 rows of source, start, length, out offset, height, width;
    source 0 is the slot, k the task's k-th file) into its planar place in the slot. None, or (row, why)
    for the first image that failed (the loader names it; row -1: no image's fault)."""
    size, n, files = _HEAD.unpack_from(msg)
    at = _HEAD.size + n
    buf = _mapped(msg[_HEAD.size:at].decode(), size)
    sources = [buf]
    for _ in range(files):
        fsize, inode, k = _FILE.unpack_from(msg, at)
        at += _FILE.size + k
        try:
            sources.append(_mapped(msg[at - k:at].decode(), fsize, inode))
        except (OSError, _Changed) as e:
            return -1, f"{e}; the cache was rebuilt or moved while a loader read it: make a new loader"
    rows = np.frombuffer(msg, dtype=np.int64, offset=at + -at % 8).reshape(-1, 6).tolist()
    for j, (f, a, n, o, h, w) in enumerate(rows):
        try:
            planes_at_size(sources[f][a:a + n], h, w, buf[o:o + 3 * h * w])
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
            return j, str(e) or type(e).__name__
    return None


def serve(conn, others: list, nice: int) -> None:
    """Worker: decode each task read from conn until an empty message or the pipe's end (the loader
    gone). The loader's ends of this and earlier workers' pipes are closed here, so that its end is
    seen when the loader dies."""
    for c in others:
        c.close()
    _worker_init(nice)
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not msg:
            return
        try:
            bad = decode_task(msg)
        except Exception as e:  # noqa: BLE001 - not an image's fault (memory, the slot): told, not a dead worker
            bad = -1, f"{type(e).__name__}: {e}"
        conn.send_bytes(b"" if bad is None else f"{bad[0]}\n{bad[1]}".encode(errors="replace"))
