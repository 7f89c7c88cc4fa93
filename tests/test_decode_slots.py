"""The decode processes' shared slots (read/backends/decode_pool.py Slot): files made and removed,
page-locked where the driver allows (registered, and unregistered while still mapped), room checked."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import numpy as np
import pytest

from fastdata.read.backends.decode_pool import Slot
from helpers import random_jpeg as _jpeg, spans_batch as _batch


def test_a_slot_file_is_removed_at_close_and_at_exit_without_close(pool, tmp_path):
    """tmpfs holds RAM: close() removes the slot's file, and so does the end of a run that never closed
    its loader (Ctrl-C, an exception)."""
    slot = Slot()
    pool.decode(slot, _batch([_jpeg(8, 8, 0)]), np.array([8]), np.array([8]), str)
    path = slot.path
    assert os.path.isfile(path)
    slot.close()
    assert not os.path.exists(path)
    script = ("import sys\nfrom fastdata.read.backends.decode_pool import Slot\n"
              "s = Slot()\ns.ensure(4096)\nprint(s.path, flush=True)\nraise KeyboardInterrupt\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    left = run.stdout.strip()
    assert run.returncode != 0 and "KeyboardInterrupt" in run.stderr
    assert left.startswith(tempfile.gettempdir() if not os.path.isdir("/dev/shm") else "/dev/shm/")
    assert not os.path.exists(left)


def _mapping_at(address: int) -> str | None:
    """The file mapped at address in this process, from /proc/self/maps."""
    with open("/proc/self/maps") as f:
        for line in f:
            span, *rest = line.split()
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return rest[4] if len(rest) > 4 else ""
    return None


def _mapped(path: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(path) for line in f)


@pytest.fixture
def fake_driver(monkeypatch):
    """host_pin's driver calls recorded; each unregister notes whether the file registered at that
    address is still mapped there."""
    from fastdata.read.backends import host_pin

    calls, files = [], {}

    def register(address, nbytes, device):
        calls.append(("register", address, nbytes, device))
        if device < 0:                                  # a negative device: the driver refuses
            return None
        files[address] = _mapping_at(address)
        return address, device

    def unregister(token):
        calls.append(("unregister", token[0], _mapping_at(token[0]) == files.pop(token[0])))

    monkeypatch.setattr(host_pin, "register", register)
    monkeypatch.setattr(host_pin, "unregister", unregister)
    return calls


def test_a_slot_is_unregistered_while_still_mapped_on_close_growth_and_collection(fake_driver):
    """A slot unmapped while registered kept the old pages locked under its address, and the next slot
    mapped there gave torch another loader's pixels (GPU suite, 2026-12-07): each registration goes
    before its mapping, at close(), when the slot grows, and when a slot never closed is collected."""
    import gc

    slot = Slot(0)
    slot.ensure(4096)
    assert slot.pinned and fake_driver[-1][0] == "register" and fake_driver[-1][3] == 0
    first = fake_driver[-1][1]
    slot.ensure(1 << 20)                                   # grows: a new file, the old one released
    assert fake_driver[-2] == ("unregister", first, True) and fake_driver[-1][0] == "register"
    second, path = fake_driver[-1][1], slot.path
    slot.close()
    assert fake_driver[-1] == ("unregister", second, True) and not os.path.exists(path)
    slot.close()                                           # twice: nothing more
    assert fake_driver[-1][1] == second and len(fake_driver) == 4
    dropped = Slot(0)
    dropped.ensure(8192)
    third, path = fake_driver[-1][1], dropped.path
    del dropped
    gc.collect()
    assert fake_driver[-1] == ("unregister", third, True)
    assert not os.path.exists(path) and not _mapped(path)


def test_a_slot_the_driver_will_not_page_lock_is_used_pageable(fake_driver):
    refused, plain = Slot(-1), Slot()
    try:
        for s in (refused, plain):
            s.ensure(4096)[:3] = [1, 2, 3]
            assert not s.pinned and s.array[:3].tolist() == [1, 2, 3]
        assert [c[0] for c in fake_driver] == ["register"]      # (a slot without a device asks nothing)
    finally:
        refused.close()
        plain.close()
    assert [c[0] for c in fake_driver] == ["register"]          # nothing registered: nothing undone


def test_without_a_cuda_driver_page_locking_declines_quietly(monkeypatch):
    from fastdata.read.backends import host_pin

    monkeypatch.setattr(host_pin, "_DRIVER", [None])
    assert host_pin.register(4096, 4096, 0) is None


def test_a_slot_without_room_says_so_instead_of_a_bus_error(monkeypatch):
    """A slot is allocated whole (posix_fallocate): on a full /dev/shm (Docker's 64 MB) the loader gets a
    clear error at once, where a sparse file would kill the first writer past the room with SIGBUS."""
    import errno

    from fastdata.read.backends import decode_pool

    made = []
    real_mkstemp = tempfile.mkstemp

    def mkstemp(**kw):
        fd, path = real_mkstemp(**kw)
        made.append(path)
        return fd, path

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(decode_pool.tempfile, "mkstemp", mkstemp)
    monkeypatch.setattr(decode_pool.os, "posix_fallocate", full)
    slot = Slot()
    with pytest.raises(decode_pool.SlotSpaceError, match=r"No space left.*--shm-size.*cpu_processes=0"):
        slot.ensure(1 << 20)
    assert made and not os.path.exists(made[0]) and slot.path is None


@pytest.mark.parametrize("asked", [None, 0.5])
def test_a_default_share_without_slot_room_goes_back_to_the_gpu(jpeg_cache, asked):
    """Out of /dev/shm: a share picked by default (cpu_share=None) is given back to the GPU, with a
    warning, and the batch goes whole to the GPU; a share the user asked for raises the error."""
    from fastdata.read.backends.decode_pool import SlotSpaceError
    from fastdata.read.backends.nvjpeg import NvjpegBackend
    from fastdata.read.encoded import EncodedSource

    class NoRoom:
        def decode(self, *a):
            raise SlotSpaceError("/dev/shm/x: cannot make a 9 MB decode slot (No space left on device)")

    src = EncodedSource(jpeg_cache)
    cfg = SimpleNamespace(options=SimpleNamespace(cpu_share=asked))
    me = SimpleNamespace(_share=0.5, encoded=src, _procs=NoRoom(), cfg=cfg, _count=lambda *a: None)
    idx = np.arange(6)
    batch = src.get_spans(idx)
    sizes = batch.baseline_sizes()
    if asked is not None:
        with pytest.raises(SlotSpaceError):
            NvjpegBackend._split(me, batch, idx, sizes, None, {"shared": Slot()})
        return
    gpu, got, cpu = NvjpegBackend._split(me, batch, idx, sizes, None, {"shared": Slot()})
    assert cpu is None and len(gpu) == 6 and got is sizes and me._share == 0.0
