"""How far the host may run ahead of the GPU, so that data wait is measured where it happens.

The engine only launches work, so without a bound the host races ahead until the CUDA launch queue
is full and then blocks inside whichever launch comes next. On a GPU-bound run that is most often
the loader's on-device augmentation, and the block was booked as data wait (38% on a run at 96.9%
of the synthetic ceiling). With at most `limit` steps in flight the host waits here instead, on
the oldest step's event, and that time counts as compute; a later wait in next(loader) then means
the loader really was behind despite `limit` steps of lead.
"""
from __future__ import annotations

from collections import deque
from typing import Callable


class StepFence:
    """record() after each optimizer step; wait() before fetching the next batch."""

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


def cuda_event_factory(device) -> Callable[[], object] | None:
    """Events on the current stream of a CUDA device; None (no fencing) elsewhere."""
    if device.type != "cuda":
        return None
    import torch
    return torch.cuda.Event
