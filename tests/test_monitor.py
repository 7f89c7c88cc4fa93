"""Monitor and doctor on CPU: planted bottlenecks are named, samplers degrade cleanly."""
from __future__ import annotations

import subprocess
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import fastdata
from fastdata.read.augment import AugmentConfig
from fastdata.engine.config import EngineConfig
from fastdata.engine.engine import Engine
from fastdata.engine.models import SmallNet
from fastdata.monitor.doctor import COMPUTE, H2D, INPUT, LAUNCH, Watch, diagnose, run_doctor
from fastdata.monitor.nvml import GpuSampler
from fastdata.monitor.profile import _union


class SlowDataset(Dataset):
    """A planted input bottleneck: 50 ms per sample in one worker (400 ms a batch), asleep, so a busy
    machine cannot shrink it; the step of the tiny model on one thread stays far below it under load."""

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.randn(3, 32, 32), i % 10


def test_slow_dataset_is_input_bound(monkeypatch):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # no OpenMP team to spin against background load
    try:
        eng = Engine(SmallNet(10, width=8), EngineConfig(precision="fp32", log_every=10**6))
        diag = run_doctor(eng, DataLoader(SlowDataset(), 8, num_workers=1), seconds=2.0)
    finally:
        torch.set_num_threads(threads)
    assert diag.verdict == INPUT and diag.measured["data_wait_frac"] > 0.5
    assert "build-cache" in diag.fixes[0][0] and diag.fixes[0][1] > 2


def test_fast_loader_with_a_model_is_not_input_bound(raw_cache):
    dl = fastdata.loader(raw_cache, 32, device="cpu", augment=AugmentConfig(size=96))
    eng = Engine(SmallNet(10, width=32), EngineConfig(precision="fp32", log_every=10**6))
    diag = run_doctor(eng, dl, seconds=3.0)
    assert diag.verdict == COMPUTE, diag.text()
    assert diag.fixes[0][0].startswith("AMP bf16")


def test_rules_for_gpu_measurements():
    assert diagnose({"data_wait_frac": 0.05, "h2d": 0.4, "gpu_busy": 0.9}).verdict == H2D
    d = diagnose({"data_wait_frac": 0.02, "h2d": 0.01, "gpu_busy": 0.35, "compiled": False})
    assert d.verdict == LAUNCH and "CUDA graph" in d.fixes[0][0] and abs(d.fixes[0][1] - 1 / 0.35) < 1e-6
    assert diagnose({"data_wait_frac": 0.02, "h2d": 0.01, "gpu_busy": 0.97}).verdict == COMPUTE


def test_watch_measures_a_users_loop():
    w = Watch()
    for _ in w.loader(DataLoader(SlowDataset(), 4, num_workers=0)):
        torch.randn(64, 64) @ torch.randn(64, 64)
        w.step()
        if w.steps == 10:
            break
    assert w.diagnosis().verdict == INPUT and w.measured()["steps"] == 10


def test_sampler_degrades_without_nvml():
    s = GpuSampler()
    with s:
        time.sleep(0.05)
    if not s.available:
        assert "NVML unavailable" in s.summary()["reason"]


def test_interval_union():
    assert _union([(0, 2), (1, 3), (5, 6)]) == 4


def test_doctor_cli_without_target_says_what_to_do():
    r = subprocess.run([sys.executable, "-m", "fastdata.cli", "doctor"], capture_output=True, text=True)
    assert r.returncode == 2 and "--data CACHE" in r.stderr


def test_sampler_reads_jpeg_engine_and_skips_absent_counters():
    from types import SimpleNamespace

    def absent(*_):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    fake = SimpleNamespace(
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=97, memory=40),
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=2 * 2**30),
        nvmlDeviceGetPowerUsage=absent, NVML_CLOCK_SM=1,
        nvmlDeviceGetClockInfo=lambda h, kind: 1980,
        nvmlDeviceGetJpgUtilization=lambda h: [55, 166666])
    s = GpuSampler()
    s._nv, s._handle = fake, object()
    rec = s._basic()
    assert rec["duty_cycle"] == 97.0 and rec["jpeg_engine_util"] == 55.0 and rec["sm_clock_mhz"] == 1980.0
    assert "power_w" not in rec and rec["mem_used_gib"] == 2.0
