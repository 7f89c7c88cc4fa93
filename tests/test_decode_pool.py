"""NvjpegOptions.cpu_processes: the CPU share decoded in forked processes into shared slots
(read/backends/decode_pool.py), without a GPU."""
from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from fastdata.errors import LoaderError
from fastdata.read.backends.decode_pool import DECODE_NICE, MIN_TASK, DecodePool, Slot
from fastdata.read.config import split_options
from helpers import planar_rgb, random_jpeg as _jpeg, spans_batch as _batch




def test_the_share_is_decoded_planar_back_to_back_across_processes(pool):
    sizes = [(30, 40), (9, 17), (12, 12), (33, 8)] * (MIN_TASK // 2)    # enough for both processes
    jpegs = [_jpeg(w, h, k) for k, (h, w) in enumerate(sizes)]
    h, w = np.array([s[0] for s in sizes]), np.array([s[1] for s in sizes])
    slot = Slot()
    try:
        flat = pool.decode(slot, _batch(jpegs), h, w, str)
        assert np.array_equal(flat, np.concatenate([planar_rgb(j) for j in jpegs]))
        assert slot.path.startswith("/dev/shm/") or not os.path.isdir("/dev/shm")
    finally:
        slot.close()


def test_a_grey_jpeg_is_decoded_as_rgb_as_the_gpu_decoder_does(pool):
    jpegs = [_jpeg(20, 10, 0, "L"), _jpeg(20, 10, 1)]
    slot = Slot()
    try:
        flat = pool.decode(slot, _batch(jpegs), np.array([10, 10]), np.array([20, 20]), str)
        assert np.array_equal(flat, np.concatenate([planar_rgb(j) for j in jpegs]))
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
        assert np.array_equal(pool.decode(slot, _batch([good]), h[:1], w[:1], str), planar_rgb(good))  # still serves
    finally:
        slot.close()


def test_a_slot_grows_into_a_new_file_and_close_removes_what_it_made(pool):
    slot = Slot()
    small = [_jpeg(8, 8, 0)]
    pool.decode(slot, _batch(small), np.array([8]), np.array([8]), str)
    first = slot.path
    big = [_jpeg(300, 200, k) for k in range(3)]
    flat = pool.decode(slot, _batch(big), np.full(3, 200), np.full(3, 300), str)
    assert np.array_equal(flat, np.concatenate([planar_rgb(j) for j in big]))
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
        assert np.array_equal(pixels.numpy(), np.concatenate([planar_rgb(a) for a in batch.arrays()[3:]]))
        assert h.tolist() == sizes[0][3:].tolist() and w.tolist() == sizes[1][3:].tolist()
    finally:
        del pixels
        slot["shared"].close()


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
        assert np.array_equal(flat, np.concatenate([planar_rgb(j) for j in jpegs]))
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
                        np.concatenate([planar_rgb(j) for j in jpegs])))
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
                                  np.concatenate([planar_rgb(j) for j in jpegs]))
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
