"""host_probe.py's wrappers for the host's lead over the GPU (fastdata/read/fence.py).

- Fenced: any iterable handed out as a Loader with max_inflight_batches=limit hands out its batches,
  so a synthetic row can be fenced like a loader row.
- GilSampled: a thread beside the loop that sleeps 2 ms and times how late it wakes. Waking, it must
  take the GIL back, so its lateness is what any loader thread waits for the GIL at that moment
  (timer slack aside, which the synthetic row shows). A host blocked inside a kernel launch on a full
  CUDA queue holds the GIL; the sampler sees that as milliseconds.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import torch

from fastdata.read.fence import StepFence, cuda_event_factory

SAMPLE_S = 0.002


class Fenced:
    def __init__(self, data, limit: int) -> None:
        self.data, self.limit = data, limit

    def __iter__(self):
        fence = StepFence(self.limit, cuda_event_factory(torch.device("cuda"), blocking=True))
        it = iter(self.data)
        while True:
            fence.record()
            fence.wait()
            try:
                batch = next(it)
            except StopIteration:
                return
            yield batch

    def close(self) -> None:
        if hasattr(self.data, "close"):
            self.data.close()


class GilSampled:
    """data's batches, with the GIL sampler running until close(), which prints its lateness."""

    def __init__(self, data, label: str) -> None:
        self.data, self.label, self.late = data, label, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="gil-sampler")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            time.sleep(SAMPLE_S)
            self.late.append(time.perf_counter() - t0 - SAMPLE_S)

    def __iter__(self):
        return iter(self.data)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        if hasattr(self.data, "close"):
            self.data.close()
        late = np.array(self.late[50:] or [np.nan]) * 1e6     # (the loop's warm-up steps left out)
        print(f"GIL sampler, {self.label}: {len(late)} wake-ups {SAMPLE_S * 1e3:.0f} ms apart, late by (us) median "
              f"{np.median(late):.0f}, p90 {np.percentile(late, 90):.0f}, p99 {np.percentile(late, 99):.0f}, "
              f"max {late.max():.0f}; {np.mean(late > 1000):.1%} over 1 ms", flush=True)
