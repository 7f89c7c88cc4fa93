"""The CPU's share of an nvjpeg batch (NvjpegOptions.cpu_share): its last images decoded in the reader
thread (libjpeg-turbo, through torchvision's CPU decode_jpeg or PIL: DECODER), uploaded as pixels,
and cropped by the same planar kernel as nvJPEG's output.

Why: beside a fast model nvJPEG's hardware batch is a serial round trip per image (a copy, a colour
kernel and a host wait each: benchmarks/hw_output.py), which the training's kernels stretch: beside
resnet18 on an H100 it decoded 8.2-12.3k img/s where the model takes ~16k, while most of the 16 CPU
cores sat idle. libjpeg-turbo decodes a 256 px cache image in ~0.3 ms on one core of the CPU box
(PIL), with the GIL released meanwhile. Splitting each batch between the two, as DALI's
hw_decoder_load splits between engines and CUDA, puts both to work. The crop boxes and flips are
drawn for the whole batch before the split, so a batch's windows do not depend on the share; its
pixels differ by the two decoders' rounding (IDCT, chroma upsampling) only.

Measured (H100, 2026-12-07, README "Compact caches"): it loses beside resnet18, 21-32% of synthetic at
every share against 82% for the GPU decode alone; a reader thread took ~2.3 ms an image and the training
loop's launches slowed from 14 to 55-68 ms a step. The cause found later (py-spy, README "Compact
caches"): the per-batch walk of the JPEG headers for the sizes, now made once a shard. By default the
share is decoded in processes (decode_pool.py) into page-locked slots (host_pin.py); this module's
reader-thread decode runs where cpu_processes=0 asks for it.
"""
from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from ...cache.hw_decode import Planes
from ...errors import LoaderError


# which CPU decoder: "torchvision" (libjpeg-turbo through torch.ops: one GIL release per image, planar
# output) or "pil" (Image.open parses the markers in Python and tobytes copies in 64 KB calls: about
# 90 us of GIL per image on the CPU box). The probe rows compare them (host_probe.py --jpeg)
DECODER = "torchvision"


def cpu_count(share: float, n: int) -> int:
    """How many of a batch of n images the CPU decodes."""
    return min(n, int(round(share * n)))


def _checked_rgb(im: Image.Image, h: int, w: int) -> Image.Image:
    """im as RGB; OSError where it decodes to another size than its header gave (a header the walk misread)."""
    img = im if im.mode == "RGB" else im.convert("RGB")
    if img.size != (w, h):
        raise OSError(f"decoded {img.size[0]}x{img.size[1]}, header says {w}x{h}")
    return img


def rgb_at_size(data, h: int, w: int) -> np.ndarray:
    """One JPEG decoded by PIL to RGB (h, w, 3), the size its header gave (else OSError)."""
    with Image.open(io.BytesIO(data), formats=["JPEG"]) as im:
        return np.asarray(_checked_rgb(im, h, w))


def planes_at_size(data, h: int, w: int, out: np.ndarray) -> None:
    """One JPEG decoded by PIL into out (3 * h * w uint8) as planar RGB (nvJPEG's layout), the size its
    header gave (else OSError). Each plane comes out of PIL's raw encoder in one C pass: 35 us for a 256 px
    image on the CPU box, where an HWC array and a transposing copy took 85-90 us (of ~520 us in all)."""
    with Image.open(io.BytesIO(data), formats=["JPEG"]) as im:
        img = _checked_rgb(im, h, w)
        for k, band in enumerate("RGB"):
            out[k * h * w:(k + 1) * h * w] = np.frombuffer(img.tobytes("raw", band), dtype=np.uint8)


def decode_pixels(arrays: list[np.ndarray], heights: np.ndarray, widths: np.ndarray, name_of,
                  pin: bool) -> torch.Tensor:
    """Reader thread: each JPEG decoded to RGB at its header's size, HWC, back to back in one uint8
    tensor (pinned where pin, so the upload is a DMA that waits for nothing). name_of(j) names image j
    in an error."""
    sizes = heights * widths * 3
    out = torch.empty(int(sizes.sum()), dtype=torch.uint8, pin_memory=pin)
    flat, at = out.numpy(), 0
    for j, (data, h, w, n) in enumerate(zip(arrays, heights.tolist(), widths.tolist(), sizes.tolist())):
        try:
            flat[at:at + n] = rgb_at_size(data, h, w).reshape(-1)
        except (OSError, ValueError, Image.DecompressionBombError) as e:
            raise LoaderError(f"{name_of(j)}: {e}; fix or remove the file, or run `fastdata build-cache` to "
                              f"quarantine bad files first") from None
        at += n
    return out


def decode_planes(arrays: list[np.ndarray], heights: np.ndarray, widths: np.ndarray, name_of,
                  pin: bool) -> torch.Tensor:
    """decode_pixels by torchvision's CPU decode_jpeg: planar (CHW) images back to back."""
    from torchvision.io import ImageReadMode, decode_jpeg

    out = torch.empty(int((heights * widths * 3).sum()), dtype=torch.uint8, pin_memory=pin)
    try:
        images = decode_jpeg([torch.from_numpy(a) for a in arrays], mode=ImageReadMode.RGB)
    except RuntimeError as e:   # name the bad one by PIL's message, per image; else torchvision's
        decode_pixels(arrays, heights, widths, name_of, pin=False)
        raise LoaderError(f"torchvision could not decode one of {name_of(0)} .. {name_of(len(arrays) - 1)} "
                          f"({str(e).splitlines()[0][:120]}); set cpu_share=0 to decode them on the GPU") from e
    for j, (im, h, w) in enumerate(zip(images, heights.tolist(), widths.tolist())):
        if tuple(im.shape) != (3, h, w):
            raise LoaderError(f"{name_of(j)}: decoded {im.shape[2]}x{im.shape[1]}, header says {w}x{h}; fix or "
                              f"remove the file, or run `fastdata build-cache` to quarantine bad files first")
    at = 0
    for im, h, w in zip(images, heights.tolist(), widths.tolist()):   # decode_jpeg's CHW may be a view of HWC
        out[at:at + 3 * h * w].view(3, h, w).copy_(im)
        at += 3 * h * w
    return out


def decode_cpu(arrays, heights, widths, name_of, pin: bool) -> tuple[torch.Tensor, bool]:
    """(pixels, planar) by DECODER."""
    if DECODER == "torchvision":
        return decode_planes(arrays, heights, widths, name_of, pin), True
    return decode_pixels(arrays, heights, widths, name_of, pin), False


def upload_planar(pixels: torch.Tensor, heights: np.ndarray, widths: np.ndarray, device,
                  planar: bool = False) -> Planes:
    """GPU thread, on its stream: decode_cpu's output on the GPU as planar RGB (nvJPEG's layout): as it
    is when planar, else in one transposing copy when the images share a size (a cache built at a
    fixed size), one per image otherwise."""
    dev = pixels.to(device, non_blocking=True)
    n = len(heights)
    if planar:
        offsets = np.zeros(n, np.int64)
        np.cumsum((heights * widths * 3)[:-1], out=offsets[1:])
        return Planes(dev, offsets, heights, widths)
    if n and (heights == heights[0]).all() and (widths == widths[0]).all():
        h, w = int(heights[0]), int(widths[0])
        planar = dev.view(n, h, w, 3).permute(0, 3, 1, 2).contiguous()
        return Planes(planar, np.arange(n, dtype=np.int64) * (3 * h * w), heights, widths)
    images, at = [], 0
    for h, w in zip(heights.tolist(), widths.tolist()):
        images.append(dev[at:at + h * w * 3].view(h, w, 3).permute(2, 0, 1).contiguous())
        at += h * w * 3
    return Planes.of_images(images)
