"""The training thread waits only for the read of the batch it is handed: a backend that stages pending
reads (nvjpeg: its GPU thread waits for them) lets next() hand out batch k while the read of batch k+1 or
k+2, already within stage_ahead, is still running. Before, next() waited for those reads first."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import fastdata
from fastdata.read.core import Loader


class PendingReads:
    """A pil backend staged as nvjpeg stages: stage() gets the read's future and a thread of its own waits
    for it; read() of epoch 0's batch at `hold` (its position) waits for `release` (30 s at most)."""
    stages_pending_reads = True

    def __init__(self, inner, hold: int, release: threading.Event) -> None:
        self.inner, self.hold, self.release, self.timed_out = inner, hold, release, False
        self.stage_ahead = 2
        self._gpu = ThreadPoolExecutor(1)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def read(self, key, idx, slot):
        if key == (0, self.hold):
            self.timed_out = not self.release.wait(30)
        return self.inner.read(key, idx, slot)

    def stage(self, slot, read, n):
        def prepare():      # this thread waits for the read (a result already: a core without pending reads)
            return self.inner.stage(slot, read.result() if hasattr(read, "result") else read, n)
        return self._gpu.submit(prepare)

    def finish(self, staged, idx):
        return self.inner.finish(staged.result(), idx)

    def close(self):
        self._gpu.shutdown(wait=True)
        self.inner.close()


def test_a_late_read_of_a_batch_ahead_does_not_hold_up_this_one(jpeg_cache):
    """Batch 0 comes out while the read of batch 2 (staged with it: stage_ahead 2) waits. Before, next()
    waited for that read first (here until it gave up waiting for the release, after 30 s)."""
    base = fastdata.loader(jpeg_cache, 4, backend="pil", device="cpu", shuffle=False, augment=True)
    release = threading.Event()
    backend = PendingReads(base.backend, hold=8, release=release)     # position 8: batch 2
    loader = Loader(backend, base.cfg)
    try:
        it = iter(loader)
        first = next(it)
        release.set()
        rest = [b.indices.tolist() for b in it]
    finally:
        loader.close()
    assert not backend.timed_out and first.indices.tolist() == [0, 1, 2, 3]
    assert sorted(i for r in rest for i in r) == list(range(4, 4 * len(loader)))
