"""Background NVML sampler: what the GPU really does, not only whether a kernel was running.

nvidia-smi's utilization.gpu is a duty cycle: the fraction of time any kernel
ran. On Hopper and newer, GPM metrics say how busy the SMs were (SM_UTIL),
how full (SM_OCCUPANCY), tensor-core and DRAM use, and PCIe traffic. GPM
metrics are computed between two samples, which must be more than 100 ms
apart. Without a GPU, NVML or GPM support, the sampler records why and
returns empty summaries instead of failing.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

GPM_METRICS = {"sm_util": 2, "sm_occupancy": 3, "tensor_util": 5, "dram_bw_util": 10,
               "pcie_tx_mib_s": 20, "pcie_rx_mib_s": 21}


@dataclass(frozen=True)
class SamplerConfig:
    interval_s: float = 0.25      # > 0.1 s: GPM needs samples at least 100 ms apart
    device_index: int = 0         # CUDA device index (mapped to NVML by UUID when possible)


def nvml_handle(nv, cuda_index: int):
    """NVML's handle of CUDA device `cuda_index` (matched by UUID, so CUDA_VISIBLE_DEVICES is honoured)."""
    try:
        import torch

        uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
        return nv.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception:  # noqa: BLE001 - no torch CUDA or older NVML: fall back to the index
        return nv.nvmlDeviceGetHandleByIndex(cuda_index)


class GpuSampler:
    """with GpuSampler() as s: ...; s.summary() -> mean of each counter over the run."""

    def __init__(self, cfg: SamplerConfig = SamplerConfig()) -> None:
        self.cfg = cfg
        self.samples: list[dict] = []
        self.available, self.gpm, self.reason = False, False, ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nv = self._handle = None
        try:
            import pynvml as nv

            nv.nvmlInit()
            self._nv, self._handle = nv, nvml_handle(nv, cfg.device_index)
            self.available = True
            self.gpm = bool(nv.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice)
            if not self.gpm:
                self.reason = "GPM not supported on this GPU (needs Hopper or newer): SM activity unavailable"
        except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, no GPU...
            self.reason = f"NVML unavailable: {type(e).__name__}: {e}"

    def _basic(self) -> dict:
        nv, h = self._nv, self._handle
        util = nv.nvmlDeviceGetUtilizationRates(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        out = {"t": time.monotonic(), "duty_cycle": float(util.gpu), "mem_util": float(util.memory),
               "mem_used_gib": mem.used / 2**30}
        for key, fn in (("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h) / 1000),
                        ("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                        # the hardware JPEG engines (A100/H100): busy only when a decoder really uses them
                        ("jpeg_engine_util", lambda: nv.nvmlDeviceGetJpgUtilization(h)[0])):
            try:
                out[key] = float(fn())
            except Exception:  # noqa: BLE001 - some counters are absent on some boards
                pass
        return out

    def _gpm(self, s1, s2) -> dict:
        nv = self._nv
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_METRICS)
        mg.sample1, mg.sample2 = s1, s2
        for i, mid in enumerate(GPM_METRICS.values()):
            mg.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(mg)
        return {name: float(mg.metrics[i].value) for i, name in enumerate(GPM_METRICS)}

    def _loop(self) -> None:
        nv = self._nv
        prev = cur = None
        if self.gpm:
            prev, cur = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(self._handle, prev)
        try:
            while not self._stop.wait(self.cfg.interval_s):
                rec = self._basic()
                if self.gpm:
                    nv.nvmlGpmSampleGet(self._handle, cur)
                    rec.update(self._gpm(prev, cur))
                    prev, cur = cur, prev
                self.samples.append(rec)
        finally:
            if self.gpm:
                nv.nvmlGpmSampleFree(prev)
                nv.nvmlGpmSampleFree(cur)

    def start(self) -> "GpuSampler":
        if self.available and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="fastdata-nvml", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None

    def __enter__(self) -> "GpuSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def mark(self) -> float:
        """A timestamp to summarise from (e.g. after warm-up)."""
        return time.monotonic()

    def summary(self, since: float | None = None) -> dict:
        rows = [s for s in self.samples if since is None or s["t"] >= since]
        if not rows:
            return {"reason": self.reason or "no samples"} if self.reason or not self.available else {}
        keys = [k for k in rows[0] if k != "t"]
        out = {k: sum(r.get(k, 0.0) for r in rows) / len(rows) for k in keys}
        out["samples"] = len(rows)
        if self.reason:
            out["reason"] = self.reason
        return out
