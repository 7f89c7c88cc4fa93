"""How far the host may run ahead of the GPU: a bound on the steps (or batches) in flight.

A training loop only launches work, so without a bound the host races ahead until the CUDA launch
queue is full and then blocks inside whichever launch comes next. Two things go wrong there:

- The block holds the GIL (torch does not release it around a kernel launch), so every loader
  thread of the process that needs the GIL (to hand a batch over, to launch its own crop kernel)
  waits until the queue drains, and the batch the step after next needs comes late.
- In the Engine, the block was booked as data wait when it fell in the loader's on-device
  augmentation (38% on a run at 96.9% of the synthetic ceiling).

With at most `limit` steps in flight the host waits here instead, on the oldest step's event, with
the GIL released (torch.cuda.Event.synchronize releases it). The Engine fences its steps
(EngineConfig.max_inflight_steps); the Loader fences the batches it hands out
(LoaderConfig.max_inflight_batches), which bounds a user's own loop the same way.
"""
from __future__ import annotations

from collections import deque
from typing import Callable


class StepFence:
    """record() after each step (or when the next batch is asked for); wait() before handing it out."""

    def __init__(self, limit: int, make_event: Callable[[], object] | None):
        self.limit, self.make_event = limit, make_event
        self.pending: deque = deque()

    def record(self) -> None:
        if self.make_event is None or self.limit <= 0:
            return
        event = self.make_event()
        event.record()
        self.pending.append(event)

    def wait(self) -> None:
        while len(self.pending) >= self.limit > 0:
            self.pending.popleft().synchronize()


def cuda_event_factory(device, blocking: bool = False) -> Callable[[], object] | None:
    """Events on the current stream of a CUDA device; None (no fencing) elsewhere. blocking: the
    waiting thread sleeps instead of spinning (a core less, tens of us later to wake)."""
    if device.type != "cuda":
        return None
    import torch
    return lambda: torch.cuda.Event(blocking=blocking)
