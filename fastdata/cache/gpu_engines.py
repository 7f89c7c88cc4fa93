"""The GPU build's batch decode on the NVJPG engines (hw_decode.py), torchvision for the rest.

Why: ``build-cache --decoder nvjpeg`` decoded through torchvision's decode_jpeg, one global decoder behind a
mutex that ends each call with a host synchronise. py-spy on the H100 host found the six shard threads
waiting on that mutex, not on the GIL (pyspy-gpubuild-H100-2026-12-05-summary.txt), and the build ran at
0.68x of the 16-process CPU build. Here each shard thread has its own hardware decoder (a handle and
two states), whose calls release the GIL and queue on the thread's stream, so the engines take several
shards' batches at once.

Which images: the baseline 8-bit colour JPEGs the engines decode (read from the headers), and only
files that end with the EOI marker: whether the engines report a truncated file is not documented, and
one sent to torchvision and then the CPU codec is quarantined as the CPU build quarantines it. A batch
the engines refuse, and every other image, goes to the fallback decoder (torchvision's).
"""
from __future__ import annotations

import threading

import numpy as np
import torch

from .jpeg_header import baseline_size

_EOI = b"\xff\xd9"


def _for_engines(data) -> tuple[int, int] | None:
    """(height, width) where the engines can take this input whole, else None."""
    if isinstance(data, str) or bytes(memoryview(data)[-2:]) != _EOI:
        return None
    return baseline_size(data)


class EngineDecode:
    """decode(datas) -> (3, H, W) uint8 GPU tensors as stored, one hardware decoder per calling thread.

    fallback(datas) decodes what the engines do not take (and raises RuntimeError as torchvision does);
    open_decoder(device) -> (decoder or None, why) opens one (hw_decode.open_hardware_decoder)."""

    def __init__(self, device: torch.device, fallback, open_decoder=None) -> None:
        if open_decoder is None:
            from .hw_decode import open_hardware_decoder as open_decoder
        self.device, self.fallback, self._open = device, fallback, open_decoder
        self._local, self._lock, self._opened = threading.local(), threading.Lock(), []
        self.decoded = {"hardware": 0, "fallback": 0}
        self.why = ""

    def _decoder(self):
        if not hasattr(self._local, "decoder"):
            decoder, self.why = self._open(self.device)
            self._local.decoder = decoder
            if decoder is not None:
                with self._lock:
                    self._opened.append(decoder)
        return self._local.decoder

    def __call__(self, datas: list) -> list[torch.Tensor]:
        out: list = [None] * len(datas)
        decoder = self._decoder()
        sizes = [_for_engines(d) for d in datas] if decoder is not None else []
        mine = [i for i, s in enumerate(sizes) if s is not None]
        if mine:
            out = self._engines(decoder, datas, mine, sizes, out)
        rest = [i for i, x in enumerate(out) if x is None]
        if rest:
            for i, x in zip(rest, self.fallback([datas[i] for i in rest])):
                out[i] = x
        self._count(len(datas) - len(rest), len(rest))
        return out

    def _engines(self, decoder, datas: list, mine: list[int], sizes: list, out: list) -> list:
        """The inputs `mine` decoded on the engines into `out`; left None where the engines refuse them.
        The bytes stay alive in `datas` until the caller's copy back, which follows the decode on this
        thread's stream (nvJPEG may read them after the call returns)."""
        from .hw_decode import HardwareDecodeError

        arrays = [np.frombuffer(datas[i], dtype=np.uint8) for i in mine]
        pointers = np.array([a.ctypes.data for a in arrays], dtype=np.uint64)
        lengths = np.array([a.nbytes for a in arrays], dtype=np.uint64)
        hw = np.array([sizes[i] for i in mine], dtype=np.int64)
        try:
            stream = torch.cuda.current_stream(self.device) if self.device.type == "cuda" else None
            planes = decoder.decode(pointers, lengths, hw[:, 0], hw[:, 1], stream)
        except HardwareDecodeError:
            return out
        for i, x in zip(mine, planes.images()):
            out[i] = x
        return out

    def _count(self, hardware: int, fallback: int) -> None:
        with self._lock:
            self.decoded["hardware"] += hardware
            self.decoded["fallback"] += fallback

    def close(self) -> None:
        """Frees every thread's decoder (after their last batches)."""
        with self._lock:
            opened, self._opened = self._opened, []
        for decoder in opened:
            decoder.close()
