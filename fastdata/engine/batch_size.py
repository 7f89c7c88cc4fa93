"""batch_size="auto": the batch size with the best measured throughput, not just the largest that fits.

Candidates double from `start`; each is timed for a few steps on synthetic
input of the real shape. An OOM ends the search (memory is freed and the
search continues with what was measured). Candidates whose peak memory
exceeds `margin` of the device are rejected: training later allocates more
(loader buffers, fragmentation) than the probe did. All ranks take the
minimum of their choices, so DDP ranks agree.
"""
from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import EngineError
from .distributed import all_agree_min

log = logging.getLogger("fastdata.engine")


@dataclass(frozen=True)
class BatchSearchConfig:
    start: int = 32
    max_batch: int = 2048
    steps: int = 6             # timed steps per candidate (after 2 warm-up steps)
    margin: float = 0.90       # of total device memory
    min_gain: float = 0.03     # a bigger batch must be this much faster to be chosen


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def _time_candidate(step: Callable[[int], None], bs: int, steps: int, device: torch.device) -> float:
    for _ in range(2):
        step(bs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        step(bs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return bs * steps / (time.perf_counter() - t0)


def find_batch_size(step: Callable[[int], None], device: torch.device,
                    cfg: BatchSearchConfig = BatchSearchConfig()) -> tuple[int, list[dict]]:
    """step(bs) runs one training step at batch size bs. Returns (chosen, curve)."""
    curve: list[dict] = []
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    bs = cfg.start
    while bs <= cfg.max_batch:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            rate = _time_candidate(step, bs, cfg.steps, device)
        except RuntimeError as e:
            if not _is_oom(e):
                raise
            curve.append({"batch_size": bs, "img_per_s": 0.0, "oom": True})
            break
        finally:
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        peak = torch.cuda.max_memory_allocated(device) if total else 0
        fits = total is None or peak <= cfg.margin * total
        curve.append({"batch_size": bs, "img_per_s": rate, "peak_frac": peak / total if total else None,
                      "oom": False, "within_margin": fits})
        log.info("auto batch size: %d -> %.0f img/s%s", bs, rate, "" if fits else " (over memory margin)")
        bs *= 2
    ok = [c for c in curve if not c["oom"] and c["within_margin"]]
    if not ok:
        raise EngineError(f"auto batch size: even batch {cfg.start} does not fit; give a smaller start "
                          f"or enable activation checkpointing")
    best = ok[0]
    for c in ok[1:]:
        if c["img_per_s"] > best["img_per_s"] * (1 + cfg.min_gain):
            best = c
    return all_agree_min(best["batch_size"], device), curve
