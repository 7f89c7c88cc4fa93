"""torch.profiler over a few steps, reduced to the fractions the doctor needs.

gpu_busy: share of wall time covered by at least one GPU kernel or copy
(interval union, so overlapping streams are not double counted); h2d: share
covered by host-to-device copies. A trace for TensorBoard/Chrome can be
written with ``trace=path``.
"""
from __future__ import annotations

import time
from typing import Callable

import torch


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def profile_steps(step: Callable[[], None], steps: int = 10, trace: str | None = None) -> dict:
    """Run step() `steps` times under the profiler; return gpu_busy and h2d fractions (CUDA only)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    step()  # warm: no first-call costs in the window
    with profile(activities=acts) as prof:
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        wall_us = (time.perf_counter() - t0) * 1e6
    if trace:
        prof.export_chrome_trace(trace)
    gpu, h2d = [], []
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        span = (ev.time_range.start, ev.time_range.end)
        gpu.append(span)
        if "HtoD" in ev.name or "Memcpy HtoD" in ev.name:
            h2d.append(span)
    if not gpu:
        return {"gpu_busy": None, "h2d": None, "wall_s": wall_us / 1e6}
    window = max(wall_us, max(b for _, b in gpu) - min(a for a, _ in gpu))
    return {"gpu_busy": min(1.0, _union(gpu) / window), "h2d": min(1.0, _union(h2d) / window),
            "wall_s": wall_us / 1e6}
