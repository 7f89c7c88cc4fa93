"""The GPU augmentation as one Triton kernel: uint8 crop window in, normalised channels_last out.

Each program takes BLOCK output pixels of one sample. It reads that sample's plan row
(crop.py: affine source map, byte offset, height, width), samples the uint8 source
bilinearly with the border clamped (grid_sample's ``padding_mode="border"``,
``align_corners=False``), normalises with x * scale + shift and writes the three
channels of each pixel next to each other: NHWC memory, which is NCHW channels_last.
One read of the crop window (the four taps hit L1/L2) and one write of the output;
benchmarks/augment.py times it against the compiled and eager grid_sample kernels.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .crop import PLAN_COLUMNS

BLOCK = 512


@triton.jit
def _crop_resize_normalise(src, plan, out, scale, shift, SIZE: tl.constexpr, COLUMNS: tl.constexpr,
                           BLOCK: tl.constexpr, PLANAR: tl.constexpr):
    n = tl.program_id(1)
    pix = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = pix < SIZE * SIZE
    oy = (pix // SIZE).to(tl.float32)
    ox = (pix % SIZE).to(tl.float32)
    row = plan + n * COLUMNS
    ax, bx = tl.load(row).to(tl.float32), tl.load(row + 1).to(tl.float32)
    ay, by = tl.load(row + 2).to(tl.float32), tl.load(row + 3).to(tl.float32)
    base = tl.load(row + 4).to(tl.int64)
    h, w = tl.load(row + 5).to(tl.int32), tl.load(row + 6).to(tl.int32)
    sx = tl.minimum(tl.maximum(ax * ox + bx, 0.0), (w - 1).to(tl.float32))
    sy = tl.minimum(tl.maximum(ay * oy + by, 0.0), (h - 1).to(tl.float32))
    x0, y0 = sx.to(tl.int32), sy.to(tl.int32)          # floor: both are >= 0
    fx, fy = sx - x0.to(tl.float32), sy - y0.to(tl.float32)
    x1, y1 = tl.minimum(x0 + 1, w - 1), tl.minimum(y0 + 1, h - 1)
    if PLANAR:      # CHW planes (nvJPEG's output): pixels 1 byte apart, channels one plane apart
        step = 1
        plane = (h * w).to(tl.int64)
    else:           # HWC (the caches): pixels 3 bytes apart, channels adjacent
        step = 3
        plane = 1
    r0 = base + (y0 * w).to(tl.int64) * step
    r1 = base + (y1 * w).to(tl.int64) * step
    c0, c1 = x0.to(tl.int64) * step, x1.to(tl.int64) * step
    dst = out + (n.to(tl.int64) * SIZE * SIZE + pix) * 3
    for c in tl.static_range(3):
        ch = c * plane
        p00 = tl.load(src + r0 + c0 + ch, mask=inside, other=0).to(tl.float32)
        p01 = tl.load(src + r0 + c1 + ch, mask=inside, other=0).to(tl.float32)
        p10 = tl.load(src + r1 + c0 + ch, mask=inside, other=0).to(tl.float32)
        p11 = tl.load(src + r1 + c1 + ch, mask=inside, other=0).to(tl.float32)
        top = p00 + (p01 - p00) * fx
        bottom = p10 + (p11 - p10) * fx
        v = top + (bottom - top) * fy
        v = v * tl.load(scale + c) + tl.load(shift + c)
        tl.store(dst + c, v.to(out.dtype.element_ty), mask=inside)


def crop_resize_normalise(src: torch.Tensor, plan: torch.Tensor, size: int, scale: torch.Tensor,
                          shift: torch.Tensor, dtype: torch.dtype, planar: bool = False) -> torch.Tensor:
    """src: uint8 on the GPU, any shape (the plan holds each sample's offset and size); plan: (n, PLAN_COLUMNS)
    float64 on the same GPU. Samples are HWC, or CHW planes when planar. Offsets are bytes from
    src's first byte and may reach other allocations of the same device (nvjpeg.py: one kernel over
    the separate tensors a decoder returns). Returns (n, 3, size, size) in dtype, channels_last."""
    n = plan.shape[0]
    out = torch.empty((n, size, size, 3), dtype=dtype, device=src.device)
    if n:
        grid = (triton.cdiv(size * size, BLOCK), n)
        _crop_resize_normalise[grid](src, plan, out, scale, shift, SIZE=size, COLUMNS=PLAN_COLUMNS,
                                     BLOCK=BLOCK, PLANAR=planar, num_warps=4)
    return out.permute(0, 3, 1, 2)
