"""GPU batch augmentation from uint8 NHWC: random resized crop, flip, normalise, in one pass.

Every sample gets its own crop box and flip, expressed as an affine map and
applied with one ``grid_sample`` over the whole batch, so the cost is one
kernel launch per batch, not per image. Parameters are drawn on the device
from a generator seeded per (seed, epoch, batch): deterministic and free of
host syncs. The crop sampler follows torchvision's RandomResizedCrop
distribution (area scale and log-uniform aspect), clamped rather than
rejection-sampled so that it vectorises.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class AugmentConfig:
    size: int = 224
    train: bool = True                    # False: centre crop (resize of the central crop_fraction)
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = True
    crop_fraction: float = 0.875          # eval centre crop, as in the usual 224/256 recipe
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    dtype: str = "float32"                # float32 | bfloat16 | float16
    channels_last: bool = True
    fused: bool = False                   # torch.compile the sampling into one kernel (see _sample)


def _crop_theta(n: int, h: int, w: int, cfg: AugmentConfig, gen: torch.Generator | None,
                device: torch.device) -> torch.Tensor:
    """(n, 2, 3) affine maps from output to input normalised coordinates."""
    if not cfg.train:
        f = cfg.crop_fraction
        theta = torch.zeros(n, 2, 3, device=device)
        theta[:, 0, 0] = f * min(h, w) / w
        theta[:, 1, 1] = f * min(h, w) / h
        return theta
    u = torch.rand(n, 5, generator=gen, device=device)
    area = cfg.scale[0] + (cfg.scale[1] - cfg.scale[0]) * u[:, 0]
    log_r = math.log(cfg.ratio[0]) + (math.log(cfg.ratio[1]) - math.log(cfg.ratio[0])) * u[:, 1]
    r = torch.exp(log_r)
    cw = torch.sqrt(area * r * h / w).clamp(max=1.0)   # crop width as a fraction of the image width
    ch = torch.sqrt(area / r * w / h).clamp(max=1.0)
    cx = (2 * u[:, 2] - 1) * (1 - cw)                   # centre in [-1, 1], keeping the crop inside
    cy = (2 * u[:, 3] - 1) * (1 - ch)
    sign = torch.where(u[:, 4] < 0.5, -1.0, 1.0) if cfg.flip else torch.ones_like(cw)
    theta = torch.zeros(n, 2, 3, device=device)
    theta[:, 0, 0], theta[:, 0, 2] = cw * sign, cx
    theta[:, 1, 1], theta[:, 1, 2] = ch, cy
    return theta


_CONSTANTS: dict = {}


def _norm_constants(mean, std, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(x - 255 mean) / (255 std) as x * scale + shift; built once per device (a host-to-device copy)."""
    key = (mean, std, str(device))
    if key not in _CONSTANTS:
        m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1) * 255
        s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1) * 255
        _CONSTANTS[key] = ((1 / s).to(device), (-m / s).to(device))
    return _CONSTANTS[key]


def _sample(images: torch.Tensor, theta: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, size: int,
            dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """Crop, resize and flip by the affine maps, then normalise: uint8 NHWC -> cfg.dtype NCHW.

    Eager, this is five passes over the batch (a float copy of the whole uint8 input, the grid,
    grid_sample, addcmul, the dtype cast), which on the GPU compete with the training step for
    memory bandwidth. Compiled (AugmentConfig.fused), Inductor decomposes bilinear grid_sample into
    gathers and fuses everything into one kernel that reads uint8 and writes the output once."""
    n, h, w, c = images.shape
    x = images.permute(0, 3, 1, 2).float()              # NCHW view of NHWC memory: channels_last already
    grid = F.affine_grid(theta, [n, c, size, size], align_corners=False)
    out = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    out = torch.addcmul(shift, out, scale)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return out.to(dtype=dtype, memory_format=fmt)


_FUSED: list = []


def _fused_sample():
    """The compiled _sample, made once per process (dynamic shapes: a last partial batch reuses it)."""
    if not _FUSED:
        _FUSED.append(torch.compile(_sample, dynamic=True))
    return _FUSED[0]


def augment_batch(images: torch.Tensor, cfg: AugmentConfig, gen: torch.Generator | None = None) -> torch.Tensor:
    """uint8 (N, H, W, C) on any device -> normalised (N, C, size, size) in cfg.dtype."""
    n, h, w, c = images.shape
    theta = _crop_theta(n, h, w, cfg, gen, images.device)   # eager: torch.rand with a generator
    scale, shift = _norm_constants(cfg.mean, cfg.std, images.device)
    sample = _fused_sample() if cfg.fused else _sample
    return sample(images, theta, scale, shift, cfg.size, getattr(torch, cfg.dtype), cfg.channels_last)


def batch_seed(seed: int, epoch: int, batch: int) -> int:
    """The augmentation seed of one batch: a function of (seed, epoch, batch), so resume reproduces it."""
    return (seed * 1_000_003 + epoch) * 1_000_003 + batch


def normalize(images: torch.Tensor, cfg: AugmentConfig, flip: torch.Tensor | None = None,
              layout: str = "NHWC") -> torch.Tensor:
    """uint8/float images already at the output size -> flipped (per-sample mask), normalised cfg.dtype."""
    x = images.permute(0, 3, 1, 2) if layout == "NHWC" else images
    x = x.float()
    if flip is not None:
        x = torch.where(flip.view(-1, 1, 1, 1), x.flip(3), x)
    scale, shift = _norm_constants(cfg.mean, cfg.std, images.device)
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    return torch.addcmul(shift, x, scale).to(dtype=getattr(torch, cfg.dtype), memory_format=fmt)
