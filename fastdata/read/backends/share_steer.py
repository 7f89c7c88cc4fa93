"""Steers a CPU share the nvjpeg backend picked (cpu_share=None) to the model's pace.

Why: the share picked at start (decode_pool.resolve_share) is sized from the CPUs and the images, not
from the model. Beside a model slower than the decode processes (resnet18/50 on an H100 host) the
largest share is best: every image the GPU decodes costs the step time (~20% beside resnet18,
host-probe-resnet18-jpeg-*-2026-12-07-default-vs-engines.md). Beside a faster model, a share the
processes cannot keep up with holds the model to their rate (12 processes: ~18.5k img/s of 256 px
images), while the GPU could decode the rest.

How: the loader tells the backend, for each batch, how long the training thread waited for its read
(core.Loader._wait; 0 when it was ready). Reads are the processes' work, so a wait means the share is
too large for this model: the share falls in proportion to the time lost. A window without waits means
the processes keep up: the share rises a step. Batches already in flight when the share changed were
split with the old one, so a decision waits for them to pass (`settle`). A share the user gave is
never steered.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

log = logging.getLogger("fastdata.nvjpeg")


@dataclass(frozen=True, kw_only=True)
class SteerConfig:
    window: int = 16        # batches per decision
    step: float = 0.05      # share added after enough windows without a wait; the least it falls by
    late: float = 0.01      # waited time over the window's wall time above which the share falls
    patience: int = 32      # most clean windows a rise waits for after rises that turned out late
    floor: float = 0.0
    ceiling: float = 1.0


class ShareSteer:
    """observe(waited) for each batch handed to the training thread; `share` is the share to split with.

    A rise that turns out late doubles the clean windows the next rise waits for (to `patience`), so
    at the processes' limit the share mostly stays just under it instead of stepping over it every
    other window; a rise followed by a clean window (the limit moved: a slower model, an evaluation)
    lets the next rise come after one clean window again."""

    def __init__(self, share: float, settle: int, cfg: SteerConfig = SteerConfig(), clock=time.perf_counter):
        self.cfg, self.share, self.settle, self.clock = cfg, float(share), settle, clock
        self.changes, self._rose, self._wait_windows, self._clean = 0, False, 1, 0
        self.restart()

    def restart(self, skip: int | None = None) -> None:
        """Start a window after `skip` batches (default: the batches in flight, split before now)."""
        self._skip, self._n, self._waited, self._t0 = self.settle if skip is None else skip, 0, 0.0, None

    def observe(self, waited: float) -> float:
        """One batch was handed over after the training thread waited `waited` seconds for its read."""
        if self._skip > 0:
            self._skip -= 1
            return self.share
        if self._t0 is None:        # the window's clock starts at its first batch
            self._t0, self._n = self.clock(), 0
            return self.share
        self._n += 1
        self._waited += max(0.0, waited)
        if self._n >= self.cfg.window:
            self._decide(self.clock() - self._t0)
        return self.share

    def _decide(self, wall: float) -> None:
        c, old = self.cfg, self.share
        lost = self._waited / wall if wall > 0 else 0.0
        if lost > c.late:           # the processes are late: give the GPU about the time lost, a step at least
            self.share = max(c.floor, min(old - c.step, old * (1.0 - min(0.5, lost))))
            if self._rose:
                self._wait_windows = min(c.patience, 2 * self._wait_windows)
            self._rose, self._clean = False, 0
        elif lost <= c.late / 10:   # they keep up: a larger share, once enough windows say so
            if self._rose:          # ... and the last rise was right: the next may come as soon
                self._wait_windows = 1
            self._rose, self._clean = False, self._clean + 1
            if self._clean >= self._wait_windows and old < c.ceiling:
                self.share, self._rose, self._clean = min(c.ceiling, old + c.step), True, 0
        if self.share != old:
            self.changes += 1
            log.debug("nvjpeg: CPU share %.2f -> %.2f (%.1f%% of %.2f s waiting for reads)",
                      old, self.share, 100 * lost, wall)
            self.restart()
        else:
            self.restart(0)
