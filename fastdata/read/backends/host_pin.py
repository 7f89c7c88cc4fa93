"""Page-lock host memory that torch did not allocate (decode_pool's slots in /dev/shm) for one CUDA
device, through the driver (libcuda), so the slot's upload is a DMA that does not block the GPU thread.

Two faults of the first version (torch.cuda.cudart().cudaHostRegister; the full GPU suite with the CPU
share on, benchmarks/results/gpu-tests-H100-2026-12-07-procs-3-default.txt) set its shape:
- A failed runtime call stays the thread's last CUDA error, and torch's next kernel-launch check raised
  it as its own ("invalid argument", "resource already mapped" in an unrelated copy). A driver call
  leaves the runtime's error alone: a registration that fails here only means a pageable upload.
- A slot freed by the garbage collector (a loader never closed) was unmapped while still registered.
  Our reading of the failures: the driver kept the old pages locked under that address, the next slot
  mapped there could not register, yet torch, asking the driver, took it for page-locked and copied the
  old pages (another loader's pixels). So every registration is undone while its mapping still exists
  (Slot's finalizer, which holds the mapping). With both changes the suite passes
  (gpu-tests-H100-2026-12-07-default-share.txt).

The calls push the device's primary context (the one torch uses) around each call, since a reader
thread need not have made it current.
"""
from __future__ import annotations

import ctypes
import logging
import threading

log = logging.getLogger("fastdata.read")

_LOCK = threading.Lock()
_DRIVER: list = []          # [libcuda, or None where there is none], loaded on first use


def _driver():
    with _LOCK:
        if not _DRIVER:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
                p, i = ctypes.c_void_p, ctypes.c_int
                for name, args in {"cuDeviceGet": [p, i], "cuDevicePrimaryCtxRetain": [p, i],
                                   "cuDevicePrimaryCtxRelease_v2": [i], "cuCtxPushCurrent_v2": [p],
                                   "cuCtxPopCurrent_v2": [p], "cuMemHostUnregister": [p],
                                   "cuMemHostRegister_v2": [p, ctypes.c_size_t, ctypes.c_uint]}.items():
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = args, i
            except (OSError, AttributeError) as e:
                log.debug("no CUDA driver to page-lock decode slots (%s): their uploads are pageable", e)
                lib = None
            _DRIVER.append(lib)
    return _DRIVER[0]


def _in_context(lib, device: int, call) -> int:
    """call() with the device's primary context current on this thread; its CUresult (or the failed
    context call's)."""
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    rc = lib.cuDeviceGet(ctypes.byref(dev), device) or lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
    if rc:
        return rc
    try:
        rc = lib.cuCtxPushCurrent_v2(ctx)
        if rc:
            return rc
        try:
            return call()
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(dev)


def register(address: int, nbytes: int, device: int) -> tuple[int, int] | None:
    """Page-lock [address, address + nbytes) for the device: a token for unregister(), or None where
    it could not be (no driver, or the driver refused; the memory stays pageable and usable)."""
    lib = _driver()
    if lib is None:
        return None
    rc = _in_context(lib, device, lambda: lib.cuMemHostRegister_v2(ctypes.c_void_p(address), nbytes, 0))
    if rc:
        log.debug("cuMemHostRegister of a %d MB decode slot failed (CUresult %d): its uploads are pageable",
                  nbytes >> 20, rc)
        return None
    return address, device


def unregister(token: tuple[int, int]) -> None:
    """Undo register(); call it while the memory is still mapped."""
    lib = _driver()
    address, device = token
    rc = _in_context(lib, device, lambda: lib.cuMemHostUnregister(ctypes.c_void_p(address)))
    if rc:
        log.debug("cuMemHostUnregister failed (CUresult %d)", rc)
