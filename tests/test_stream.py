"""Caches bigger than the loader's memory: streamed shard by shard, every sample once, memory bounded."""
from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

import fastdata

from fastdata.read import stream
from helpers import build, check_resume, epoch_indices


def _resident(path: Path) -> int:
    """Bytes of the file in the page cache (mincore over a fresh read-only mapping)."""
    size = path.stat().st_size
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        addr = np.frombuffer(m, dtype=np.uint8).ctypes.data
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) == 0
        resident = sum(v & 1 for v in vec) * mmap.PAGESIZE
    return resident


@pytest.fixture(scope="module")
def big_cache(image_folder, tmp_path_factory):
    """960 samples of 64 px (12 KB) in 15 shards: 11.8 MB."""
    root = tmp_path_factory.mktemp("stream")
    lst = root / "list.csv"
    lst.write_text("".join(f"{p},{k % 10}\n" for k in range(8) for p in sorted(image_folder.rglob("*.jpg"))))
    build(lst, root / "c", workers=2, shard_size="800KB")
    return root / "c"


def _drop(files) -> None:
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


@pytest.mark.parametrize("fill", ["populate", "advise"])
def test_streaming_reads_every_sample_once_within_the_budget(big_cache, fill, monkeypatch):
    monkeypatch.setattr(stream, "FILL", fill)
    files = sorted(big_cache.glob("shard-*"))
    total = sum(p.stat().st_size for p in files)
    budget = total // 2                                           # the cache is 2x the loader's memory
    dl = fastdata.loader(big_cache, 16, device="cpu", memory=budget, integrity="off")
    try:
        assert dl.backend._streamer is not None and dl.order.cfg.window < 960
        _drop(files)
        io0 = int(dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())["read_bytes"])
        peak = 0
        for k, _ in enumerate(dl):
            if k % 4 == 0:
                peak = max(peak, sum(_resident(p) for p in files))
        io1 = int(dict(line.split(": ") for line in open("/proc/self/io").read().splitlines())["read_bytes"])
        cov = dl.coverage()
    finally:
        # closed here: a loader left open goes on filling the next epoch's shards from its side threads,
        # which a busy machine slowed into the next test's count of these files' resident pages
        dl.close()
    assert cov["seen"] == 960 and cov["repeated"] == 0 and cov["missed"] == 0
    assert peak <= budget, (peak, budget)                          # dropped behind the order
    assert io1 - io0 <= 1.3 * total                                # no sample read from storage twice over


def test_streaming_opens_announced_shards_before_a_reader_needs_them(big_cache):
    dl = fastdata.loader(big_cache, 16, device="cpu", memory="6MB", integrity="off")
    streamer = dl.backend._streamer
    _drop(sorted(big_cache.glob("shard-*")))
    it = iter(dl)
    next(it)
    announced = set(streamer._announced)
    streamer._opener.submit(lambda: None).result()               # one thread, first in first out: drained
    assert len(announced) > 2 and announced <= set(dl.backend.cache._shards)
    assert sum(len(b[1]) for b in it) == 960 - 16
    dl.close()
    assert streamer._opener is None


def test_streaming_order_is_deterministic_and_resumes_exactly(big_cache):
    make = lambda: fastdata.loader(big_cache, 16, device="cpu", memory="6MB", seed=3)  # noqa: E731
    a, b = make(), make()
    assert [x.tolist() for x in epoch_indices(a)] == [x.tolist() for x in epoch_indices(b)]
    a.close()
    b.close()
    check_resume(make, stop_after=7)
    with pytest.raises(fastdata.FastdataError, match="window"):
        other = fastdata.loader(big_cache, 16, device="cpu", memory=None, seed=3)
        other.load_state_dict(make().state_dict())


def test_a_budget_too_small_for_four_shards_is_refused(big_cache):
    with pytest.raises(fastdata.FastdataError, match="cannot hold 4 shards"):
        fastdata.loader(big_cache, 16, device="cpu", memory="1MB")


def test_auto_mode_leaves_a_cache_that_fits_alone(raw_cache):
    dl = fastdata.loader(raw_cache, 16, device="cpu")
    assert dl.backend._streamer is None and dl.order.cfg.window == 16384


def test_populate_reads_a_whole_file_into_the_page_cache(big_cache):
    path = sorted(big_cache.glob("shard-*"))[0]
    size = path.stat().st_size
    _drop([path])
    if _resident(path) > size // 2:
        pytest.skip(f"{path.parent}: this file system keeps dropped pages (tmpfs?), so residency says nothing")
    assert stream.populate(path) is True
    assert _resident(path) >= size - mmap.PAGESIZE


def test_a_kernel_without_populate_falls_back_to_willneed_and_reads_everything(big_cache, monkeypatch):
    asked = []
    monkeypatch.setattr(stream, "populate", lambda path: asked.append(path) or False)
    dl = fastdata.loader(big_cache, 16, device="cpu", memory="6MB", integrity="off")
    assert sum(len(b[1]) for b in dl) == 960 and dl.coverage()["repeated"] == 0
    streamer = dl.backend._streamer
    assert asked and not streamer._populates      # asked once or so, then WILLNEED for the rest
    dl.close()


def test_a_shard_still_being_populated_is_dropped_only_after(big_cache, monkeypatch):
    """Dropping a shard whose fill still runs waits for it: pages faulted in after the drop would stay."""
    import threading

    started, release, order = threading.Event(), threading.Event(), []

    def slow(path):
        started.set()
        release.wait(60)
        order.append(f"populated {path.name}")
        return True

    monkeypatch.setattr(stream, "populate", slow)
    dl = fastdata.loader(big_cache, 16, device="cpu", memory="6MB", integrity="off")
    streamer = dl.backend._streamer
    monkeypatch.setattr(streamer, "_advise", lambda s, advice: order.append(f"dropped {s}"))
    name = streamer.cache.manifest.shards[0].name
    monkeypatch.setattr(streamer.cache, "gather_table", lambda: None)
    streamer._fill(0)
    streamer._fill(1)
    streamer._fill(2)                 # queued behind two running fills (FILL_THREADS = 2)
    started.wait(60)
    streamer._drop(2)                 # not started: cancelled, dropped at once
    assert order == ["dropped 2"]
    dropper = threading.Thread(target=streamer._drop, args=(0,))
    dropper.start()
    release.set()
    dropper.join(60)
    assert order.index(f"populated {name}") < order.index("dropped 0")
    dl.close()


def _smaps_entry(address: int) -> tuple[str, str]:
    """(permissions, VmFlags) of the mapping holding address, from /proc/self/smaps."""
    perms, inside = None, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                inside, perms = lo <= address < hi, head[1]
            elif inside and head[0] == "VmFlags:":
                return perms, " ".join(head[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def test_cpu_batches_are_private_and_asked_for_huge_pages():
    """A CPU batch's own mapping is private (Python's mmap default, MAP_SHARED, made each page a shmem
    fault: 2.3-3.0x slower batches) and advised for transparent huge pages (VmFlags 'hg')."""
    from fastdata.read.backends.raw import _host_images

    batch = _host_images((16, 256, 256, 3))
    batch.fill_(7)
    perms, flags = _smaps_entry(batch.data_ptr())
    assert perms.endswith("p"), perms
    if os.path.isdir("/sys/kernel/mm/transparent_hugepage"):   # (a kernel built without THP refuses the advice)
        assert "hg" in flags.split(), flags
    assert int(batch.sum()) == 7 * batch.numel()
    small = _host_images((4, 8, 8, 3))                    # under one huge page: no advice
    assert _smaps_entry(small.data_ptr())[0].endswith("p")
