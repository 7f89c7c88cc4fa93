"""Crop and resize a batch of differently sized images in a few kernels, on any device.

Decoders that yield one tensor per image (nvJPEG through torchvision) would
otherwise crop and resize image by image: about four kernel launches each,
a thousand per batch, all from Python. Here the images are packed into one
zero-padded batch, box-filtered by a whole factor when every crop in the
batch shrinks by at least that much (the anti-aliasing that bilinear alone
lacks), and sampled with one ``grid_sample`` whose per-image affine map
places each crop box (and its flip). Sample points are clamped inside each
image so the padding never bleeds into the edge pixels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..augment import to_device


def pack(images: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """CHW uint8 tensors -> zero-padded (N, C, Hmax, Wmax) batch and (N, 2) sizes (h, w) on the host."""
    sizes = torch.tensor([[im.shape[1], im.shape[2]] for im in images], dtype=torch.int64)
    hmax, wmax = (int(v) for v in sizes.max(0).values)
    out = images[0].new_zeros((len(images), images[0].shape[0], hmax, wmax))
    for k, im in enumerate(images):
        out[k, :, :im.shape[1], :im.shape[2]].copy_(im)
    return out, sizes


PACK_PIXELS = 1 << 27   # padded pixels per packed part: its float copy stays under 1.6 GB


def pack_spans(pixels: list[int], limit: int | None = None) -> list[tuple[int, int]]:
    """[lo, hi) runs of images whose packed batch (n x the largest) holds at most `limit` pixels. One
    pack of 256 twelve-megapixel phone photos read from a folder was a 9 GB batch and a 37 GB float copy."""
    limit = limit or PACK_PIXELS
    spans, lo, largest = [], 0, 0
    for i, px in enumerate(pixels):
        largest = max(largest, px)
        if i > lo and (i - lo + 1) * largest > limit:
            spans.append((lo, i))
            lo, largest = i, px
    return spans + [(lo, len(pixels))] if pixels else spans


def crop_resize(packed: torch.Tensor, sizes: torch.Tensor, boxes: torch.Tensor, size: int,
                flips: torch.Tensor | None = None) -> torch.Tensor:
    """Bilinear crop-and-resize of each image's box (top, left, height, width; host int tensor (N, 4))
    to size x size, flipped where `flips` (host bool (N,)) is set. Returns float32 (N, C, size, size)."""
    boxes = boxes.to(torch.float64)
    factor = max(1, int((boxes[:, 2:].min() / size).floor()))   # whole-factor box prefilter, shared
    x = packed.float()
    if factor > 1:
        x = F.avg_pool2d(x, factor, ceil_mode=True)
    n, _, hp, wp = x.shape
    top, left, ch, cw = (boxes[:, i] / factor for i in range(4))
    sx = cw / wp
    if flips is not None:
        sx = torch.where(flips, -sx, sx)
    theta = torch.zeros(n, 2, 3, dtype=torch.float64)
    theta[:, 0, 0], theta[:, 0, 2] = sx, (2 * left + cw) / wp - 1
    theta[:, 1, 1], theta[:, 1, 2] = ch / hp, (2 * top + ch) / hp - 1
    grid = F.affine_grid(to_device(theta.float(), x.device), [n, 1, size, size], align_corners=False)
    # clamp to each image's own pixel centres (0 .. extent-1) in normalised coordinates
    extent = (sizes.to(torch.float64) / factor).floor().clamp(min=1)   # whole pooled pixels only
    lo = torch.stack([1 / torch.full((n,), float(wp)), 1 / torch.full((n,), float(hp))], 1) - 1
    hi = torch.stack([(2 * extent[:, 1] - 1) / wp, (2 * extent[:, 0] - 1) / hp], 1) - 1
    lo, hi = (to_device(v.float(), x.device).view(n, 1, 1, 2) for v in (lo, hi))
    grid = torch.maximum(torch.minimum(grid, hi), lo)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
