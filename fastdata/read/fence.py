"""How far the host may run ahead of the GPU: a bound on the steps (or batches) in flight.

A training loop only launches work, so without a bound the host races ahead until the CUDA launch
queue is full and then blocks inside whichever launch comes next. In the Engine that block was booked
as data wait when it fell in the loader's on-device augmentation (38% on a run at 96.9% of the
synthetic ceiling). With at most `limit` steps in flight the host waits here instead, on the oldest
step's event, with the GIL released, and that time counts as compute.

The Engine fences its steps (EngineConfig.max_inflight_steps); the Loader fences the batches it hands
out (LoaderConfig.max_inflight_batches, 3 by default; lifted while Engine.fit drives it), which bounds a
user's own loop the same way. It was tried as a cure for resnet18 fed from a JPEG cache losing time
beside the loader's threads, on the guess that a host blocked on a full launch queue holds the GIL from
them. A thread waking every 2 ms beside the loop found the GIL as free with the fence as without (the
launches release it), so the guess was wrong, yet the loop gained: 90.3-91.8% of synthetic fenced at 3
against 83.1-83.8% unbounded over 7 rounds on a slower H100 host, with a synthetic batch fenced at 3 at
99.9% and the raw cache unchanged (host-probe-*-H100-80GB-HBM3-2026-12-07-fence3*.md). Why a bounded
lead helps there is not measured; a guess: the loader's GPU thread launches its decode and augmentation
into a queue the training thread keeps full, and waits behind it.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Callable


class StepFence:
    """record() after each step (or when the next batch is asked for); wait() before handing it out."""

    def __init__(self, limit: int, make_event: Callable[[], object] | None):
        self.limit, self.make_event = limit, make_event
        self.pending: deque = deque()
        self.waited = 0.0       # seconds spent in wait() for the GPU: backlog, not data wait

    def record(self) -> None:
        if self.make_event is None or self.limit <= 0:
            return
        event = self.make_event()
        if event is None:        # no event to record now (a CUDA graph being captured)
            return
        event.record()
        self.pending.append(event)

    def rebound(self, limit: int) -> int:
        """A new limit from the next record() on (the events pending under the old one are dropped);
        returns the old limit. waited keeps its total."""
        old, self.limit = self.limit, limit
        self.pending.clear()
        return old

    def wait(self) -> None:
        if len(self.pending) < self.limit or self.limit <= 0:
            return
        t = time.perf_counter()
        while len(self.pending) >= self.limit:
            self.pending.popleft().synchronize()
        self.waited += time.perf_counter() - t


def cuda_event_factory(device, blocking: bool = False) -> Callable[[], object] | None:
    """Events on the current stream of a CUDA device (none while that stream is being captured into a
    CUDA graph); None (no fencing) elsewhere. blocking: the waiting thread sleeps instead of spinning
    (a core less, tens of us later to wake)."""
    if device.type != "cuda":
        return None
    import torch

    def make():
        # recording an event into a stream being captured is an error: a user capturing a graph around
        # next(loader) gets no fence for those batches rather than a failed capture
        return None if torch.cuda.is_current_stream_capturing() else torch.cuda.Event(blocking=blocking)
    return make
