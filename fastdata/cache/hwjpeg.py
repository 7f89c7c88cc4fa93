"""Is the GPU's hardware JPEG decoder (NVJPG engines) usable from this process?

DALI's ``hw_decoder_load`` sends that share of the images to the NVJPG
engines, which decode without the SMs and without DALI's CPU threads (for
images under ``hybrid_huffman_threshold`` pixels nvJPEG's hybrid backend
does the Huffman decoding on the CPU). Where the engines are not reachable
DALI silently decodes everything the hybrid way and ``hw_decoder_load``
changes nothing. The usual causes: a GPU without the engines (most besides
A100, A30, H100, H200) or a container started without the driver's ``video``
capability (``--gpus '"capabilities=compute,utility,video"'``). On an H200
the probe finds 7 engines; decode alone barely changes with hw_decoder_load,
but end to end 1.0 is faster (no CPU Huffman decoding competes with the
training process): benchmarks/decode.py and pipeline.py, the README's DALI
section.

This asks nvJPEG itself: nvjpegCreateEx with the hardware backend succeeds
only where the engines are usable, and nvjpegGetHardwareDecoderInfo counts
them. It loads whichever libnvjpeg is installed (the nvidia-nvjpeg wheel that
DALI pulls in, torchvision's bundled copy, or the system's) through ctypes, so
it needs neither DALI nor a CUDA context of torch's. The nvjpeg backend decodes on the same
engines through hw_decode.py, which opens the library with load_nvjpeg.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path

_BACKEND_HARDWARE = 3       # nvjpegBackend_t NVJPEG_BACKEND_HARDWARE
STATUS = {0: "success", 1: "not initialized", 2: "invalid parameter", 3: "bad jpeg", 4: "jpeg not supported",
           5: "allocator failure", 6: "execution failed", 7: "arch mismatch (no hardware decoder on this GPU "
           "or not exposed to this container)", 8: "internal error", 9: "implementation not supported"}


def _candidates() -> list[str]:
    """libnvjpeg files to try, most specific first."""
    found = []
    for root in map(Path, sys.path):
        for pattern in ("nvidia/nvjpeg/lib/libnvjpeg.so*", "nvidia/cu*/lib/libnvjpeg.so*",
                        "torchvision.libs/libnvjpeg*.so*", "torchvision/libnvjpeg*.so*"):
            found += sorted(glob.glob(str(root / pattern)))
    return found + ["libnvjpeg.so", "libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so.11"]


def load_nvjpeg() -> tuple[ctypes.CDLL | None, str]:
    errors = []
    for name in _candidates():
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            errors.append(str(e).split(":")[-1].strip())
    return None, f"no libnvjpeg found ({len(errors)} tried); pip install nvidia-nvjpeg-cu12 or DALI"


def hardware_jpeg_decoder() -> dict:
    """{'available': bool, 'engines': int, 'cores_per_engine': int, 'library': str, 'reason': str,
    'driver_capabilities': NVIDIA_DRIVER_CAPABILITIES or None}. Never raises."""
    info = {"available": False, "engines": 0, "cores_per_engine": 0, "library": "", "reason": "",
            "driver_capabilities": os.environ.get("NVIDIA_DRIVER_CAPABILITIES")}
    lib, name = load_nvjpeg()
    info["library"] = name
    if lib is None:
        info["reason"] = name
        return info
    handle = ctypes.c_void_p()
    status = lib.nvjpegCreateEx(_BACKEND_HARDWARE, None, None, 0, ctypes.byref(handle))
    if status != 0:
        info["reason"] = f"nvjpegCreateEx(hardware) returned {status}: {STATUS.get(status, 'unknown')}"
        return info
    engines, cores = ctypes.c_uint(0), ctypes.c_uint(0)
    if hasattr(lib, "nvjpegGetHardwareDecoderInfo"):
        if lib.nvjpegGetHardwareDecoderInfo(handle, ctypes.byref(engines), ctypes.byref(cores)) == 0:
            info["engines"], info["cores_per_engine"] = engines.value, cores.value
    lib.nvjpegDestroy(handle)
    info["available"] = True
    info["reason"] = "hardware backend created"
    return info


if __name__ == "__main__":
    import json

    print(json.dumps(hardware_jpeg_decoder(), indent=1))
