"""A profiled window reduced to the doctor's fractions, and its picture (optional matplotlib extra).

gpu_busy: share of the window's wall time covered by at least one GPU kernel or copy (interval
union: overlapping streams are not double counted); h2d: share covered by host-to-device copies;
kernels_per_step and mean_kernel_us tell small-kernel (launch-bound) steps from big ones.
The PNG has four lanes over the profiled steps: data wait (host in next(loader)), H2D copies,
kernels, and GPU idle; its numbers go in the report JSON either way.
"""
from __future__ import annotations

import logging

from .profile import _union

log = logging.getLogger("fastdata.doctor")


def _gpu_intervals(prof) -> tuple[list, list]:
    import torch

    kernels, h2d = [], []
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        span = (ev.time_range.start / 1e6, ev.time_range.end / 1e6)
        (h2d if "HtoD" in ev.name else kernels).append(span)
    return kernels, h2d


def fractions(prof, wall: float, steps: int, t0: float, waits: list, png: str | None) -> dict:
    kernels, h2d = _gpu_intervals(prof)
    host_waits = [(a - t0, b - t0) for a, b in waits]
    out = {"profiled_steps": steps, "profiled_s": round(wall, 3),
           "wait_in_profile": round(_union(host_waits) / wall, 3) if wall > 0 else None}
    if kernels or h2d:
        out.update(gpu_busy=min(1.0, _union(kernels + h2d) / wall), h2d=min(1.0, _union(h2d) / wall),
                   kernels_per_step=round(len(kernels) / max(1, steps), 1),
                   mean_kernel_us=round(1e6 * sum(b - a for a, b in kernels) / max(1, len(kernels)), 1))
    if png:
        try:
            draw(png, wall, host_waits, h2d, kernels)
            out["timeline_png"] = png
        except ImportError:
            log.warning("no timeline picture: pip install 'fastdata[plot]' (matplotlib)")
    return out


def _idle(busy: list, wall: float) -> list:
    gaps, end = [], 0.0
    for a, b in sorted(busy):
        if a > end:
            gaps.append((end, a))
        end = max(end, b)
    if end < wall:
        gaps.append((end, wall))
    return gaps


def draw(path: str, wall: float, waits: list, h2d: list, kernels: list) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lanes = [("data wait", waits, "tab:red"), ("H2D copy", h2d, "tab:orange"), ("kernels", kernels, "tab:green"),
             ("GPU idle", _idle(kernels + h2d, wall), "tab:gray")]
    fig, ax = plt.subplots(figsize=(12, 2.6))
    for row, (name, spans, color) in enumerate(lanes):
        ax.broken_barh([(a * 1e3, (b - a) * 1e3) for a, b in spans], (row - 0.4, 0.8), color=color)
    ax.set_yticks(range(len(lanes)), [n for n, _, _ in lanes])
    ax.set_xlabel("ms into the profiled steps")
    ax.set_xlim(0, wall * 1e3)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
