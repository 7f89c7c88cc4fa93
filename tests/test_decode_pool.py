"""NvjpegOptions.cpu_processes: the CPU share decoded in forked processes into shared slots
(read/backends/decode_pool.py), without a GPU."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from fastdata.errors import LoaderError
from fastdata.read.backends.decode_pool import DECODE_NICE, MIN_TASK, DecodePool, Slot
from fastdata.read.config import split_options
from fastdata.read.spans import EncodedBatch
from helpers import random_jpeg as _jpeg




def _planar(data) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(bytes(data))).convert("RGB")).transpose(2, 0, 1).reshape(-1)


@pytest.fixture(scope="module")
def pool():
    p = DecodePool(2)
    yield p
    p.close()


def _batch(jpegs):
    """The images as spans of one shard-like buffer, as a JPEG cache's batch is."""
    buf = np.concatenate(jpegs)
    ends = np.cumsum([j.nbytes for j in jpegs])
    return EncodedBatch((buf,), np.zeros(len(jpegs), np.int64), ends - [j.nbytes for j in jpegs], ends,
                        np.arange(len(jpegs), dtype=np.int64))


def test_the_share_is_decoded_planar_back_to_back_across_processes(pool):
    sizes = [(30, 40), (9, 17), (12, 12), (33, 8)] * (MIN_TASK // 2)    # enough for both processes
    jpegs = [_jpeg(w, h, k) for k, (h, w) in enumerate(sizes)]
    h, w = np.array([s[0] for s in sizes]), np.array([s[1] for s in sizes])
    slot = Slot()
    try:
        flat = pool.decode(slot, _batch(jpegs), h, w, str)
        assert np.array_equal(flat, np.concatenate([_planar(j) for j in jpegs]))
        assert slot.path.startswith("/dev/shm/") or not os.path.isdir("/dev/shm")
    finally:
        slot.close()


def test_a_grey_jpeg_is_decoded_as_rgb_as_the_gpu_decoder_does(pool):
    jpegs = [_jpeg(20, 10, 0, "L"), _jpeg(20, 10, 1)]
    slot = Slot()
    try:
        flat = pool.decode(slot, _batch(jpegs), np.array([10, 10]), np.array([20, 20]), str)
        assert np.array_equal(flat, np.concatenate([_planar(j) for j in jpegs]))
    finally:
        slot.close()


def test_a_bad_image_is_named_by_the_loader_and_the_header_is_checked(pool):
    good, bad = _jpeg(20, 10, 0), _jpeg(20, 10, 1)[:60]
    jpegs = [good] * (2 * MIN_TASK) + [bad]     # the bad one in the second process's task
    h, w = np.full(len(jpegs), 10), np.full(len(jpegs), 20)
    slot = Slot()
    try:
        with pytest.raises(LoaderError, match=rf"img{len(jpegs) - 1}: .*build-cache"):
            pool.decode(slot, _batch(jpegs), h, w, lambda j: f"img{j}")
        with pytest.raises(LoaderError, match=r"img1: decoded 20x10, header says 21x10"):
            pool.decode(slot, _batch([good, good]), h[:2], np.array([20, 21]), lambda j: f"img{j}")
        assert np.array_equal(pool.decode(slot, _batch([good]), h[:1], w[:1], str), _planar(good))  # still serves
    finally:
        slot.close()


def test_a_slot_grows_into_a_new_file_and_close_removes_what_it_made(pool):
    slot = Slot()
    small = [_jpeg(8, 8, 0)]
    pool.decode(slot, _batch(small), np.array([8]), np.array([8]), str)
    first = slot.path
    big = [_jpeg(300, 200, k) for k in range(3)]
    flat = pool.decode(slot, _batch(big), np.full(3, 200), np.full(3, 300), str)
    assert np.array_equal(flat, np.concatenate([_planar(j) for j in big]))
    assert slot.path != first and not os.path.exists(first)
    del flat
    last = slot.path
    slot.close()
    assert not os.path.exists(last)
    slot.close()                    # twice is harmless


def test_a_killed_decode_process_is_a_loader_error_naming_the_option():
    p = DecodePool(1)
    slot = Slot()
    try:
        pid = p.pids[0]
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(LoaderError, match="decode process .* died.*cpu_processes"):
            for _ in range(50):     # a pipe may take a call or two to tell
                p.decode(slot, _batch([_jpeg(8, 8, 0)]), np.array([8]), np.array([8]), str)
    finally:
        p.close()
        slot.close()


def test_cpu_processes_is_a_checked_option_that_needs_a_share():
    assert split_options("nvjpeg", {}).cpu_processes is None
    for ok in ({"cpu_share": 0.5, "cpu_processes": 4}, {"cpu_share": None, "cpu_processes": 4}, {"cpu_share": 0.3}, {}):
        split_options("nvjpeg", ok).check()
    for bad in (-1, 1.5, "4", True):
        with pytest.raises(LoaderError, match="cpu_processes"):
            split_options("nvjpeg", {"cpu_share": 0.5, "cpu_processes": bad}).check()
    with pytest.raises(LoaderError, match="cpu_share=0: the processes would decode nothing"):
        split_options("nvjpeg", {"cpu_share": 0, "cpu_processes": 4}).check()


@pytest.mark.parametrize("cpus,local,share,procs,pixels,want", [
    (16, None, None, None, 256 * 256, (1.0, 12)),    # the measured H100 host and cache: every image on the CPU
    (16, None, None, None, 512 * 512, (0.25, 12)),   # images 4x larger: a quarter of each batch
    (16, None, None, None, 128 * 128, (1.0, 12)),    # smaller ones: still all of it
    (16, None, None, None, None, (0.0, 0)),          # JPEG files (sizes unknown): the GPU decodes them all
    (128, "8", None, None, 256 * 256, (1.0, 12)),    # 8 ranks of torchrun share the host's 128 CPUs
    (8, None, None, None, 256 * 256, (1 / 3, 4)),    # fewer processes take a smaller share
    (5, None, None, None, 256 * 256, (0.0, 0)),      # one process would not pay: the GPU decodes
    (2, None, 0.5, None, None, (0.5, 0)),            # a share asked for on a small host: the reader threads
    (16, None, 0.0, None, 256 * 256, (0.0, 0)),      # off
    (16, None, None, 0, 256 * 256, (0.0, 0)),        # no processes and no share given: off
    (16, None, 0.4, 3, None, (0.4, 3)),              # both given: as given
    (16, "x", None, None, 256 * 256, (1.0, 12)),     # a LOCAL_WORLD_SIZE that is not a number: taken as 1
])
def test_the_share_and_the_processes_are_picked_from_this_ranks_cpus(monkeypatch, cpus, local, share, procs, pixels,
                                                                     want):
    from fastdata.read.backends import decode_pool

    monkeypatch.setattr(decode_pool, "usable_cpus", lambda: cpus)
    if local is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local)
    got = decode_pool.resolve_share(share, procs, pixels)
    assert got[1] == want[1] and got[0] == pytest.approx(want[0])


def test_the_share_is_sized_by_a_jpeg_caches_images(jpeg_cache, image_folder):
    """mean_pixels: a JPEG cache's mean image size from its first shard's headers; None for files."""
    from fastdata.read.backends.nvjpeg import mean_pixels
    from fastdata.read.encoded import EncodedSource

    src = EncodedSource(jpeg_cache)
    hw = np.array([Image.open(io.BytesIO(a)).size for a in src.get_batch(np.arange(src.shard_counts[0]))[0]])
    assert mean_pixels(src) == pytest.approx(float((hw[:, 0] * hw[:, 1]).mean()))
    assert mean_pixels(EncodedSource(image_folder)) is None


def test_the_backend_hands_the_share_to_the_processes(jpeg_cache, pool):
    """NvjpegBackend._split with decode processes: the CPU's images come back planar, from the slot."""
    from fastdata.read.backends.nvjpeg import NvjpegBackend
    from fastdata.read.encoded import EncodedSource

    src = EncodedSource(jpeg_cache)
    counted = {}
    me = SimpleNamespace(_share=0.5, encoded=src, _procs=pool, _count=lambda which, n: counted.__setitem__(which, n))
    idx = np.array([3, 0, 5, 1, 7, 2])
    batch = src.get_spans(idx)
    sizes = batch.baseline_sizes()
    slot = {"shared": Slot()}
    try:
        gpu, _, (pixels, h, w, planar) = NvjpegBackend._split(me, batch, idx, sizes, None, slot)
        assert planar is True and len(gpu) == 3 and counted == {"cpu": 3}
        assert isinstance(pixels, torch.Tensor) and pixels.dtype == torch.uint8
        assert np.array_equal(pixels.numpy(), np.concatenate([_planar(a) for a in batch.arrays()[3:]]))
        assert h.tolist() == sizes[0][3:].tolist() and w.tolist() == sizes[1][3:].tolist()
    finally:
        del pixels
        slot["shared"].close()


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


def _spy_writes(monkeypatch, forward: bool = True) -> list:
    """The pool's writes to its workers' pipes, recorded (and passed on unless `forward` is off)."""
    from fastdata.read.backends import decode_pool

    sent, write = [], decode_pool._write_message

    def spy(fd, msg):
        sent.append(msg)
        if forward:
            write(fd, msg)
    monkeypatch.setattr(decode_pool, "_write_message", spy)
    return sent


@pytest.mark.parametrize("processes,readers,per_batch", [(12, 8, 3), (12, 1, 12), (2, 8, 2), (4, 4, 2), (1, 8, 1)])
def test_a_batch_is_cut_into_as_few_tasks_as_keep_the_processes_busy(processes, readers, per_batch):
    """Each task costs the loader's process CPU beside the training thread: as few as keep every
    process busy while each reader has a batch in flight, not one per process."""
    from fastdata.read.backends.decode_pool import tasks_per_batch

    assert tasks_per_batch(processes, readers) == per_batch
    assert tasks_per_batch(processes, readers) * readers >= processes


def test_the_pool_sends_a_batch_in_per_batch_tasks_and_still_decodes_it_whole(monkeypatch):
    p = DecodePool(3, readers=3)
    sizes = [(30, 40), (9, 17), (12, 12), (33, 8)] * (2 * MIN_TASK)
    jpegs = [_jpeg(w, h, k) for k, (h, w) in enumerate(sizes)]
    h, w = np.array([s[0] for s in sizes]), np.array([s[1] for s in sizes])
    sent = _spy_writes(monkeypatch)
    slot = Slot()
    try:
        flat = p.decode(slot, _batch(jpegs), h, w, str)
        assert p.per_batch == 2 and len(sent) == 2     # 3 processes, 3 readers: 2 tasks, not 3
        assert np.array_equal(flat, np.concatenate([_planar(j) for j in jpegs]))
    finally:
        slot.close()
        p.close()


@pytest.mark.parametrize("nice", [DECODE_NICE, 0])
def test_decode_processes_run_at_the_pools_niceness_and_the_loader_keeps_its_own(nice):
    """Where decoders and the training thread share the CPUs, the scheduler must favour the training
    thread (decode_priority.py): each worker is niced by `nice` (at most 19), the loader's process is not."""
    own = os.getpriority(os.PRIO_PROCESS, 0)
    p = DecodePool(2, nice=nice)
    want, deadline = [min(19, own + nice)] * 2, time.monotonic() + 60
    try:
        while True:     # all forked by __init__; a worker not yet given a task may not have run its initializer
            seen = [os.getpriority(os.PRIO_PROCESS, pid) for pid in p.pids]
            if seen == want or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        p.close()
    assert seen == want
    assert os.getpriority(os.PRIO_PROCESS, 0) == own


def test_queued_tasks_go_to_a_freed_worker_oldest_first(monkeypatch):
    """The training thread waits for the oldest batch: with every worker busy, a freed worker takes
    the task queued first, whichever reader queued it."""
    from fastdata.read.backends.decode_pool import _Task

    p, sent = DecodePool(1), _spy_writes(monkeypatch, forward=False)
    try:
        busy = p._idle.pop()
        older, newer = _Task(b"older"), _Task(b"newer")
        with p._lock:
            p._pending.extend([older, newer])
            p._pump()
        assert sent == [] and not older.sent.is_set()
        with p._lock:
            p._idle.append(busy)
            p._pump()
        assert sent == [b"older"] and older.sent.is_set() and older.worker == 0 and not newer.sent.is_set()
    finally:
        p.close()


def test_many_readers_share_few_workers_and_each_gets_its_own_batch_back():
    """Six reader threads, two workers, batches of different images: no reader waits forever for a
    worker, and each gets its own pixels (answers are read from the workers its tasks went to)."""
    import threading

    p = DecodePool(2)
    batches = []
    for r in range(6):
        sizes = [(8 + r, 10 + (k % 3)) for k in range(2 * MIN_TASK + r)]
        jpegs = [_jpeg(w, h, 100 * r + k) for k, (h, w) in enumerate(sizes)]
        batches.append((_batch(jpegs), np.array([s[0] for s in sizes]), np.array([s[1] for s in sizes]),
                        np.concatenate([_planar(j) for j in jpegs])))
    wrong, errors = [], []

    def reader(r):
        slot = Slot()
        try:
            for _ in range(4):
                batch, h, w, want = batches[r]
                if not np.array_equal(p.decode(slot, batch, h, w, str), want):
                    wrong.append(r)
        except Exception as e:  # noqa: BLE001 - reported by the assert below
            errors.append(repr(e))
        finally:
            slot.close()

    threads = [threading.Thread(target=reader, args=(r,)) for r in range(6)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads), "a reader never got its batch back"
        assert errors == [] and wrong == []
    finally:
        p.close()


def test_a_worker_error_that_is_no_images_fault_is_told_as_such(monkeypatch):
    """A worker that fails outside an image's decode (here: its slot file gone) answers with the
    error, which the loader raises without blaming an image, and the pool keeps working."""
    p, slot = DecodePool(1), Slot()
    try:
        jpegs = [_jpeg(8, 8, k) for k in range(3)]
        h = w = np.full(3, 8)
        ensure = slot.ensure

        def gone(nbytes):        # the slot as the loader sees it, its file removed before the worker maps it
            buf = ensure(nbytes)
            os.unlink(slot.path)
            return buf
        monkeypatch.setattr(slot, "ensure", gone)
        with pytest.raises(LoaderError, match=r"decode process failed on a batch's share \(FileNotFoundError"):
            p.decode(slot, _batch(jpegs), h, w, lambda j: f"image{j}")
        monkeypatch.undo()
        other = Slot()
        try:
            assert np.array_equal(p.decode(other, _batch(jpegs), h, w, str),
                                  np.concatenate([_planar(j) for j in jpegs]))
        finally:
            other.close()
    finally:
        p.close()
        slot.close()


def _alive(pid: int) -> bool:
    """pid runs and is not a zombie (a reaped or exited worker is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.mark.parametrize("ending", ["exit without close", "killed"])
def test_decode_processes_do_not_outlive_the_loaders_process(ending):
    """A run that ends without closing its loader, or is killed (SIGKILL: no handler runs), leaves no
    decode process behind holding memory: each sees its pipe end and exits."""
    script = ("import os, sys, signal\nfrom fastdata.read.backends.decode_pool import DecodePool\n"
              "p = DecodePool(2)\nprint(*p.pids, flush=True)\n"
              + ("os.kill(os.getpid(), signal.SIGKILL)\n" if ending == "killed" else "sys.exit(0)\n"))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    pids = [int(v) for v in run.stdout.split()]
    assert len(pids) == 2, run.stderr
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


@pytest.fixture(scope="module", params=["h5", "pt"])
def shard_cache(request, image_folder, tmp_path_factory):
    """A JPEG cache of several shards in each shard format."""
    from helpers import build

    dest = tmp_path_factory.mktemp(f"direct-{request.param}") / "cache"
    build(image_folder, dest, encode="jpeg", quality=90, shard_size="150KB", workers=2, format=request.param)
    return dest


def test_a_caches_batch_is_read_by_the_processes_from_its_files(shard_cache, pool, monkeypatch):
    """The default for a local cache: the rows name each shard file and offset, no JPEG byte is copied into
    the slot, and the pixels equal those decoded from the bytes copied in (DIRECT_READS off)."""
    from fastdata.read.backends import decode_pool
    from fastdata.read.encoded import EncodedSource

    src = EncodedSource(shard_cache)
    idx = np.random.default_rng(0).permutation(len(src))[:3 * MIN_TASK]
    batch = src.get_spans(np.sort(idx), sizes=True)
    assert batch.files is not None and len(batch.buffers) > 1     # several shards, each a file
    h, w = batch.baseline_sizes()
    got = {}
    for direct in (True, False):
        monkeypatch.setattr(decode_pool, "DIRECT_READS", direct)
        slot = Slot()
        try:
            got[direct] = pool.decode(slot, batch, h, w, str).copy()
            got[direct, "slot"] = slot.size
        finally:
            slot.close()
    assert np.array_equal(got[True], got[False])
    assert np.array_equal(got[True], np.concatenate([_planar(a) for a in batch.arrays()]))
    assert got[True, "slot"] < got[False, "slot"]     # no room for the JPEG bytes


def test_a_shard_rebuilt_under_the_loader_is_an_error_not_other_pixels(shard_cache, tmp_path):
    """A shard file replaced at its path after the loader opened it (another inode) is refused by the
    decode process, which would otherwise decode the new file's bytes at the old offsets."""
    import shutil

    from fastdata.read.encoded import EncodedSource

    copy = tmp_path / "cache"
    shutil.copytree(shard_cache, copy)
    src = EncodedSource(copy)
    batch = src.get_spans(np.arange(MIN_TASK), sizes=True)
    h, w = batch.baseline_sizes()
    path = batch.files[0][0]
    shutil.copyfile(path, path + ".new")
    os.replace(path + ".new", path)          # same bytes, a new file
    p, slot = DecodePool(1), Slot()
    try:
        with pytest.raises(LoaderError, match="changed since the loader opened it.*make a new loader"):
            p.decode(slot, batch, h, w, str)
    finally:
        p.close()
        slot.close()


def test_the_sample_index_gives_the_spans_the_shard_walk_gives(shard_cache):
    """sample_index.py against EncodedSource's shard-by-shard walk: the same bytes, labels and sizes."""
    from fastdata.read.encoded import EncodedSource

    fast, walk = EncodedSource(shard_cache), EncodedSource(shard_cache)
    walk._index = None
    rng = np.random.default_rng(1)
    for n in (1, 7, len(fast)):
        idx = np.sort(rng.permutation(len(fast))[:n])
        a, b = fast.get_spans(idx, sizes=True), walk.get_spans(idx, sizes=True)
        assert [x.tobytes() for x in a.arrays()] == [x.tobytes() for x in b.arrays()]
        assert np.array_equal(a.labels, b.labels) and np.array_equal(a.sizes, b.sizes)
        assert np.array_equal(fast.shard_sizes(0), walk.shard_sizes(0))
    assert np.array_equal(fast.get_spans(idx).labels, fast.labels()[idx])


def test_a_task_that_reads_more_files_than_a_worker_keeps_mapped_still_decodes(shard_cache, monkeypatch):
    """A worker keeps MAX_MAPS files mapped; a batch spread over more shards than that evicts maps
    its own task still reads, which must not fail the batch."""
    from fastdata.read.backends import decode_worker
    from fastdata.read.encoded import EncodedSource

    monkeypatch.setattr(decode_worker, "MAX_MAPS", 1)     # (read by the worker forked below)
    src = EncodedSource(shard_cache)
    batch = src.get_spans(np.arange(len(src)), sizes=True)
    assert len(batch.files) >= 2     # with the slot, three maps for a worker that keeps one
    h, w = batch.baseline_sizes()
    p, slot = DecodePool(1), Slot()
    try:
        flat = p.decode(slot, batch, h, w, str)
        assert np.array_equal(flat, np.concatenate([_planar(a) for a in batch.arrays()]))
    finally:
        p.close()
        slot.close()


def test_a_cache_opened_by_a_relative_path_is_read_after_the_loader_changes_directory(shard_cache, monkeypatch):
    """The decode processes keep the directory they were forked in; the files a task names are absolute."""
    from fastdata.read.encoded import EncodedSource

    p, slot = DecodePool(1), Slot()       # forked here, before the cache is opened
    try:
        monkeypatch.chdir(shard_cache.parent)
        src = EncodedSource(shard_cache.name)
        batch = src.get_spans(np.arange(MIN_TASK), sizes=True)
        assert all(os.path.isabs(f[0]) for f in batch.files)
        monkeypatch.chdir("/")
        h, w = batch.baseline_sizes()
        flat = p.decode(slot, batch, h, w, str)
        assert np.array_equal(flat, np.concatenate([_planar(a) for a in batch.arrays()]))
    finally:
        p.close()
        slot.close()
