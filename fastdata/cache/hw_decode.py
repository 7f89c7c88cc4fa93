"""Batched JPEG decode on the GPU's NVJPG engines: nvJPEG's hardware backend, called through ctypes.

Used by the nvjpeg loader (read/backends/nvjpeg.py) and by the GPU build (gpu_engines.py).

torchvision's decode_jpeg (the fallback, backends/nvjpeg.py) reaches the same engines on an A100 or
H100/H200, but the shape of its call is what stop 30 measured as the limit: feeding resnet18 on an
H200 (benchmarks/host_probe.py --jpeg), one call took 15-17 ms of the loader's 18 ms a batch
against ~10 ms alone, which capped the loader near 14k img/s. Every call of a process goes through
one global decoder behind a mutex, parses each image's header again, and ends with a host
cudaStreamSynchronize: the GPU thread waits for the whole decode, queued behind the model's kernels.

Here the batch is queued on our stream and the call returns (nvJPEG's hardware backend pipelines
nvjpegDecodeBatched by default); the sizes come from the reader threads' header parse. Two decode
states are used in turn, so the only host wait (on the loader's GPU thread) is for the batch before
the previous one, before its state is reused, as nvJPEG's own examples wait before reusing one.

Output is planar RGB in one allocation, the layout torchvision's decode_jpeg returns per image,
so the crop kernels downstream take either: a Planes (the buffer, each image's offset and size),
not a view per image, which cost the GPU thread a third of its GIL time (stop 35, py-spy). Only baseline
8-bit 3-component JPEGs are sent here (cache.jpeg_header.baseline_size of one jpeg_scan); the caller decodes any
other batch the torchvision way. Enum values and struct layout as in nvjpeg.h 12.4. Nothing here
runs at import: the library is opened on first use.
"""
from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np
import torch

from .hwjpeg import STATUS, load_nvjpeg

_BACKEND_HARDWARE = 3       # nvjpegBackend_t NVJPEG_BACKEND_HARDWARE
_OUTPUT_RGB = 3             # nvjpegOutputFormat_t NVJPEG_OUTPUT_RGB: planar, one plane per channel
_IMAGE_WORDS = 8            # nvjpegImage_t: unsigned char *channel[4]; size_t pitch[4]


class Planes(NamedTuple):
    """A decoded batch of planar RGB uint8 images on the GPU: image i's 3 planes of heights[i] x
    widths[i] start offsets[i] bytes after base's first byte (base is the lowest-addressed image)."""

    base: torch.Tensor
    offsets: np.ndarray      # int64
    heights: np.ndarray      # int64
    widths: np.ndarray
    views: list | None = None   # the decoder's own (3, H, W) tensors, where it made them
    parts: tuple = ()           # the Planes this one joins (joined()), whose images() it lists

    @classmethod
    def of_images(cls, images: list[torch.Tensor]) -> "Planes":
        """The Planes of separate (3, H, W) tensors (torchvision's decode_jpeg, turned images)."""
        ptrs = np.array([im.data_ptr() for im in images], dtype=np.int64)
        first = int(ptrs.argmin())
        return cls(images[first], ptrs - ptrs[first], np.array([im.shape[1] for im in images], dtype=np.int64),
                   np.array([im.shape[2] for im in images], dtype=np.int64), images)

    @classmethod
    def joined(cls, first: "Planes", then: "Planes") -> "Planes":
        """Both batches as one, first's images first: offsets from the lower of the two bases, so one
        planar crop kernel reads both allocations (nvJPEG's output and the pixels decoded on the CPU)."""
        pa, pb = first.base.data_ptr(), then.base.data_ptr()
        lo = min(pa, pb)
        return cls(first.base if pa <= pb else then.base,
                   np.concatenate([first.offsets + (pa - lo), then.offsets + (pb - lo)]),
                   np.concatenate([first.heights, then.heights]), np.concatenate([first.widths, then.widths]),
                   parts=(first, then))

    def images(self) -> list[torch.Tensor]:
        """A (3, H, W) view per image (made here when the decoder made none)."""
        if self.views is not None:
            return self.views
        if self.parts:
            return [im for part in self.parts for im in part.images()]
        flat = self.base.view(-1)
        return [flat[o:o + 3 * h * w].view(3, h, w) for o, h, w in
                zip(self.offsets.tolist(), self.heights.tolist(), self.widths.tolist())]


class HardwareDecodeError(RuntimeError):
    """nvJPEG's hardware backend refused a call; the caller decodes that batch another way."""


def _check(status: int, what: str) -> None:
    if status != 0:
        raise HardwareDecodeError(f"{what} returned {status}: {STATUS.get(status, 'unknown')}")


def _declare(lib) -> None:
    p = ctypes.c_void_p
    for name, args in {"nvjpegCreateEx": [ctypes.c_int, p, p, ctypes.c_uint, p],
                       "nvjpegJpegStateCreate": [p, p], "nvjpegJpegStateDestroy": [p], "nvjpegDestroy": [p],
                       "nvjpegDecodeBatchedInitialize": [p, p, ctypes.c_int, ctypes.c_int, ctypes.c_int],
                       "nvjpegDecodeBatched": [p, p, p, p, p, p]}.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:     # a libnvjpeg without the call: decode the torchvision way
            raise HardwareDecodeError(f"{name} is missing from {lib._name}") from None
        fn.argtypes, fn.restype = args, ctypes.c_int


def output_table(base: int, heights: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(nvjpegImage_t array as uint64 words, byte offset of each image from base): image i's three
    planes lie back to back at base + offset[i], each H*W bytes with pitch W."""
    plane = heights.astype(np.uint64) * widths.astype(np.uint64)
    offsets = np.zeros(len(plane), np.uint64)
    np.cumsum(3 * plane[:-1], out=offsets[1:])
    table = np.zeros((len(plane), _IMAGE_WORDS), np.uint64)
    for c in range(3):
        table[:, c] = np.uint64(base) + offsets + np.uint64(c) * plane
        table[:, 4 + c] = widths
    return table, offsets


class HardwareJpegDecoder:
    """One nvJPEG handle with the hardware backend on one device, and two batched decode states."""

    def __init__(self, device: torch.device, states: int = 2) -> None:
        lib, name = load_nvjpeg()
        if lib is None:
            raise HardwareDecodeError(name)
        _declare(lib)
        self.lib, self.library, self.device = lib, name, device
        self._handle = ctypes.c_void_p()
        with torch.cuda.device(device):
            torch.cuda.init()
            _check(lib.nvjpegCreateEx(_BACKEND_HARDWARE, None, None, 0, ctypes.byref(self._handle)),
                   "nvjpegCreateEx(hardware)")
            self._states = []
            for _ in range(states):
                state = ctypes.c_void_p()
                _check(lib.nvjpegJpegStateCreate(self._handle, ctypes.byref(state)), "nvjpegJpegStateCreate")
                self._states.append([state, None])     # [state, event of the batch it decoded last]
        self._turn = 0

    def decode(self, pointers: np.ndarray, lengths: np.ndarray, heights: np.ndarray, widths: np.ndarray,
               stream: torch.cuda.Stream) -> Planes:
        """The JPEGs at host addresses `pointers` (uint64, `lengths` bytes each), decoded on `stream`;
        valid once `stream` reaches this point. The caller keeps the bytes alive until then (nvJPEG
        may read them asynchronously): spans.EncodedBatch.pointers() gives both arrays."""
        entry = self._states[self._turn]
        self._turn = (self._turn + 1) % len(self._states)
        if entry[1] is not None:
            entry[1].synchronize()          # this state's previous batch is done with its buffers
        n = len(pointers)
        total = int((3 * heights.astype(np.int64) * widths).sum())
        with torch.cuda.device(self.device), torch.cuda.stream(stream):
            out = torch.empty(total, dtype=torch.uint8, device=self.device)
            table, offsets = output_table(out.data_ptr(), heights, widths)
            data = np.ascontiguousarray(pointers, dtype=np.uint64)
            lengths = np.ascontiguousarray(lengths, dtype=np.uint64)
            _check(self.lib.nvjpegDecodeBatchedInitialize(self._handle, entry[0], n, 1, _OUTPUT_RGB),
                   "nvjpegDecodeBatchedInitialize")
            _check(self.lib.nvjpegDecodeBatched(self._handle, entry[0], data.ctypes.data, lengths.ctypes.data,
                                                table.ctypes.data, ctypes.c_void_p(stream.cuda_stream)),
                   "nvjpegDecodeBatched")
            entry[1] = torch.cuda.Event()
            entry[1].record(stream)
        return Planes(out, offsets.astype(np.int64), np.asarray(heights, dtype=np.int64),
                      np.asarray(widths, dtype=np.int64))

    def close(self) -> None:
        """Waits for the states' last batches, then frees them and the handle (idempotent)."""
        for entry in self._states:
            if entry[1] is not None:
                entry[1].synchronize()
            self.lib.nvjpegJpegStateDestroy(entry[0])
        self._states = []
        if self._handle:
            self.lib.nvjpegDestroy(self._handle)
            self._handle = ctypes.c_void_p()


def open_hardware_decoder(device: torch.device) -> tuple[HardwareJpegDecoder | None, str]:
    """(decoder, why): None with the reason where the NVJPG engines cannot be used from here."""
    try:
        return HardwareJpegDecoder(device), "nvJPEG hardware backend"
    except HardwareDecodeError as e:
        return None, str(e)
