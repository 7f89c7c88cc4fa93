"""GPU batch augmentation from uint8 NHWC: random resized crop, flip, normalise, in one pass.

Every sample gets its own crop box and flip, drawn on the host as a plan (crop.py: torchvision's
RandomResizedCrop distribution, deterministic per (seed, epoch, batch)). The plan is applied by
one of three kernels, all reading the uint8 batch and writing cfg.dtype channels_last:

- ``triton``: one hand-written kernel (augment_triton.py), the default on a GPU with Triton;
- ``compiled``: grid_sample and the normalisation compiled by Inductor into one kernel;
- ``eager``: grid_sample, five passes over the batch; the CPU path and the reference.

A plan row also holds each sample's byte offset and size, so variable-shape batches (caches built
with --resize short|max, packed end to end) take the same path as fixed-shape ones.
"""
from __future__ import annotations

import importlib.util
import numbers
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import LoaderError
from .crop import draw_plan

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
KERNELS = ("auto", "triton", "compiled", "eager")


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
    kernel: str = "auto"                  # auto: triton on a GPU where Triton imports, else eager
    fused: bool = False                   # older spelling of kernel="compiled"

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise LoaderError(f"AugmentConfig(kernel={self.kernel!r}): choose one of {', '.join(KERNELS)}")
        bad = _invalid(self)
        if bad:   # (each used to fail deep in a reader thread, or gave NaN batches without a word)
            raise LoaderError(f"AugmentConfig({bad})")


AUGMENT_DTYPES = ("float32", "bfloat16", "float16")


def _pair_ok(p, hi: float | None) -> bool:
    return (len(p) == 2 and all(isinstance(v, (int, float)) for v in p) and 0 < p[0] <= p[1]
            and (hi is None or p[1] <= hi))


def _invalid(cfg: "AugmentConfig") -> str:
    """What is wrong with cfg, and the fix, or ''."""
    checks = [
        (isinstance(cfg.size, numbers.Integral) and 1 <= cfg.size <= 8192, f"size={cfg.size!r}: give 1..8192 pixels"),
        (_pair_ok(cfg.scale, 1.0), f"scale={cfg.scale!r}: give (lo, hi) with 0 < lo <= hi <= 1, e.g. (0.08, 1.0)"),
        (_pair_ok(cfg.ratio, None), f"ratio={cfg.ratio!r}: give (lo, hi) with 0 < lo <= hi, e.g. (3/4, 4/3)"),
        (0 < cfg.crop_fraction <= 1, f"crop_fraction={cfg.crop_fraction!r}: give a fraction in (0, 1]"),
        (len(cfg.mean) == 3 and len(cfg.std) == 3, f"mean={cfg.mean!r}, std={cfg.std!r}: give 3 values each "
                                                   f"(R, G, B)"),
        (all(v > 0 for v in cfg.std), f"std={cfg.std!r}: every value must be > 0 (0 divides by zero)"),
        (cfg.dtype in AUGMENT_DTYPES, f"dtype={cfg.dtype!r}: choose one of {', '.join(AUGMENT_DTYPES)}"),
    ]
    return next((msg for ok, msg in checks if not ok), "")


def resolve_kernel(cfg: AugmentConfig, device: torch.device) -> str:
    """The kernel that runs cfg on device: triton needs CUDA and the triton package."""
    kernel = "compiled" if cfg.fused and cfg.kernel == "auto" else cfg.kernel
    has_triton = device.type == "cuda" and importlib.util.find_spec("triton") is not None
    if kernel == "auto":
        return "triton" if has_triton else "eager"
    if kernel == "triton" and not has_triton:
        raise LoaderError(f"AugmentConfig(kernel='triton') on {device}: it needs a CUDA device and the triton "
                          f"package; use kernel='auto'")
    return kernel


_CONSTANTS: dict = {}


def _norm_constants(mean, std, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(x - 255 mean) / (255 std) as x * scale + shift; built once per device (a host-to-device copy)."""
    key = (mean, std, str(device))
    if key not in _CONSTANTS:
        m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1) * 255
        s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1) * 255
        _CONSTANTS[key] = ((1 / s).to(device), (-m / s).to(device))
    return _CONSTANTS[key]


def _grid(plan: torch.Tensor, size: int) -> torch.Tensor:
    """grid_sample's (n, size, size, 2) grid in [-1, 1] from the plan's pixel-space source map."""
    o = torch.arange(size, device=plan.device, dtype=torch.float32)
    p = plan.float()
    gx = (2 * (p[:, 0:1] * o + p[:, 1:2]) + 1) / p[:, 6:7] - 1     # (n, size)
    gy = (2 * (p[:, 2:3] * o + p[:, 3:4]) + 1) / p[:, 5:6] - 1
    n = plan.shape[0]
    return torch.stack([gx[:, None, :].expand(n, size, size), gy[:, :, None].expand(n, size, size)], dim=-1)


def _sample(images: torch.Tensor, plan: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, size: int,
            dtype: torch.dtype, channels_last: bool) -> torch.Tensor:
    """Crop, resize and flip by the plan, then normalise: uint8 NHWC -> dtype NCHW.

    Eager, this is five passes over the batch (a float copy of the whole uint8 input, the grid,
    grid_sample, addcmul, the dtype cast). Compiled (kernel="compiled"), Inductor decomposes bilinear
    grid_sample into gathers and fuses everything into one kernel."""
    x = images.permute(0, 3, 1, 2).float()              # NCHW view of NHWC memory: channels_last already
    out = F.grid_sample(x, _grid(plan, size), mode="bilinear", padding_mode="border", align_corners=False)
    out = torch.addcmul(shift, out, scale)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    return out.to(dtype=dtype, memory_format=fmt)


_FUSED: list = []


def _fused_sample():
    """The compiled _sample, made once per process (dynamic shapes: a last partial batch reuses it)."""
    if not _FUSED:
        _FUSED.append(torch.compile(_sample, dynamic=True))
    return _FUSED[0]


def apply_plan(src: torch.Tensor, plan: torch.Tensor, cfg: AugmentConfig, planar: bool = False) -> torch.Tensor:
    """Augment a batch by its plan (crop.draw_plan), both on the same device.

    src: uint8 NHWC (n, H, W, 3) when every sample has one shape, or a flat uint8
    buffer of samples packed end to end at the plan's offsets (variable shapes). planar: the
    samples are CHW planes at the plan's offsets, which may reach other allocations (nvJPEG's
    separate tensors; the Triton kernel only). Returns (n, 3, size, size) in cfg.dtype,
    channels_last when cfg.channels_last."""
    dtype = getattr(torch, cfg.dtype)
    scale, shift = _norm_constants(cfg.mean, cfg.std, src.device)
    kernel = resolve_kernel(cfg, src.device)
    if kernel == "triton":
        from .augment_triton import crop_resize_normalise

        out = crop_resize_normalise(src, plan, cfg.size, scale, shift, dtype, planar=planar)
        return out if cfg.channels_last else out.contiguous()
    if planar:
        raise ValueError("planar samples need the triton kernel")
    sample = _fused_sample() if kernel == "compiled" else _sample
    if src.dim() == 4:
        return sample(src, plan, scale, shift, cfg.size, dtype, cfg.channels_last)
    rows = plan.cpu().numpy()      # variable shapes off the fast path: one sample at a time
    outs = []
    for k, row in enumerate(rows):
        off, h, w = int(row[4]), int(row[5]), int(row[6])
        one = src[off:off + h * w * 3].view(1, h, w, 3)
        outs.append(sample(one, plan[k:k + 1], scale, shift, cfg.size, dtype, cfg.channels_last))
    fmt = torch.channels_last if cfg.channels_last else torch.contiguous_format
    return torch.cat(outs).contiguous(memory_format=fmt)


def plan_tensor(plan: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host plan on device: through pinned memory and a non-blocking copy on CUDA (no host sync)."""
    return to_device(torch.from_numpy(plan), device)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on device without a host wait: a copy from pageable memory first waits for
    everything queued on the current stream (CUDA's rule for pageable uploads), which on a decode
    thread meant waiting for its own batch's decode. Pinned (the caching host allocator keeps the
    buffer until the copy has run), then non-blocking."""
    if device.type != "cuda" or t.device.type == "cuda":
        return t.to(device)
    return (t if t.is_pinned() else t.pin_memory()).to(device, non_blocking=True)


def augment_batch(images: torch.Tensor, cfg: AugmentConfig, seed: int | torch.Generator | None = None
                  ) -> torch.Tensor:
    """uint8 (N, H, W, C) on any device -> normalised (N, C, size, size) in cfg.dtype.

    seed: the batch's seed (batch_seed), or a torch.Generator whose initial seed is used."""
    if isinstance(seed, torch.Generator):
        seed = seed.initial_seed()
    n, h, w, _ = images.shape
    plan = draw_plan(cfg, seed or 0, np.full(n, h), np.full(n, w))
    return apply_plan(images.contiguous(), plan_tensor(plan, images.device), cfg)


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
