"""GPU tests (pytest -m gpu): pinned H2D path, graph capture correctness, nvJPEG, NVML GPM."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import fastdata
from fastdata.read.augment import AugmentConfig, augment_batch
from fastdata.read.dataset import CacheDataset
from fastdata.engine.config import EngineConfig
from fastdata.engine.engine import Engine
from fastdata.engine.models import SmallNet

from helpers import pil_reference


def test_fast_loader_to_cuda_equals_cpu_reference(raw_cache):
    """Three epochs through one loader: reads made ahead across epoch ends reuse the pinned slot ring
    (prefetch 2: slots come round often), and no slot may be refilled before its copy is done."""
    ref = CacheDataset(raw_cache)
    dl = fastdata.loader(raw_cache, 16, device="cuda", seed=2, prefetch=2, threads=3)
    for _ in range(3):
        seen = 0
        for b in dl:
            assert b.images.is_cuda and b.images.dtype == torch.uint8 and b.labels.is_cuda
            for img, idx in zip(b.images.cpu(), b.indices.tolist()):
                assert np.array_equal(img.numpy(), ref[idx][0].numpy())
                seen += 1
        assert seen == len(ref)


def test_fast_loader_gpu_augment_is_deterministic(raw_cache):
    aug = AugmentConfig(size=48, dtype="bfloat16")
    a = [b.images.float().cpu() for b in fastdata.loader(raw_cache, 16, device="cuda", seed=1, augment=aug)]
    b = [b.images.float().cpu() for b in fastdata.loader(raw_cache, 16, device="cuda", seed=1, augment=aug)]
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_fused_gpu_augment_equals_eager():
    img = torch.randint(0, 255, (64, 256, 256, 3), dtype=torch.uint8, device="cuda")
    outs = [augment_batch(img, AugmentConfig(size=224, dtype="bfloat16", fused=f),
                          torch.Generator(device="cuda").manual_seed(5)).float() for f in (False, True)]
    assert (outs[0] - outs[1]).abs().max() < 0.05   # bf16 rounding of values up to ~2.6


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_triton_augment_equals_eager_on_fixed_and_packed_shapes(dtype):
    """The Triton kernel against the eager grid_sample reference, on one uint8 batch and on a packed
    buffer of variable-shape samples (a --resize short|max cache), the last partial block included."""
    from fastdata.read.augment import apply_plan, plan_tensor
    from fastdata.read.crop import draw_plan

    tol = 1e-3 if dtype == "float32" else 0.05   # float32: coordinate rounding, 0.06 of a grey level
    img = torch.randint(0, 255, (37, 200, 300, 3), dtype=torch.uint8, device="cuda")
    for train in (True, False):
        cfg = {k: AugmentConfig(size=224, dtype=dtype, train=train, kernel=k) for k in ("triton", "eager")}
        outs = {k: augment_batch(img, c, seed=9) for k, c in cfg.items()}
        assert outs["triton"].is_contiguous(memory_format=torch.channels_last)
        assert outs["triton"].dtype == getattr(torch, dtype)
        assert (outs["triton"].float() - outs["eager"].float()).abs().max() < tol
    rng = np.random.default_rng(1)
    h, w = rng.integers(100, 400, 9), rng.integers(100, 400, 9)
    flat = torch.randint(0, 255, (int((h * w * 3).sum()),), dtype=torch.uint8, device="cuda")
    plan = plan_tensor(draw_plan(AugmentConfig(size=96), 3, h, w), flat.device)
    a = apply_plan(flat, plan, AugmentConfig(size=96, dtype=dtype, kernel="triton"))
    b = apply_plan(flat, plan, AugmentConfig(size=96, dtype=dtype, kernel="eager"))
    assert (a.float() - b.float()).abs().max() < tol


def _batches(n=12, bs=32, size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, 3, size, size, generator=g), torch.randint(0, 10, (bs,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_graph_step_equals_eager_step(precision):
    torch.manual_seed(0)
    model = SmallNet(10)
    eager = Engine(copy.deepcopy(model), EngineConfig(precision=precision, lr=0.05, log_every=4))
    graph = Engine(copy.deepcopy(model), EngineConfig(precision=precision, lr=0.05, log_every=4, cuda_graph=True))
    data = _batches()
    r1 = eager.fit(data)
    r2 = graph.fit(data)
    assert r2["cuda_graph"] is True and r1["cuda_graph"] is False
    torch.backends.cudnn.deterministic = True
    for (n, p1), (_, p2) in zip(eager.model.named_parameters(), graph.model.named_parameters()):
        assert torch.allclose(p1, p2, rtol=2e-2, atol=2e-3), n
    l1 = [h["loss"] for h in r1["history"]]
    l2 = [h["loss"] for h in r2["history"]]
    assert np.allclose(l1, l2, rtol=2e-2, atol=2e-3)


def test_graph_falls_back_on_partial_batch_and_names_accum(caplog):
    eng = Engine(SmallNet(10), EngineConfig(cuda_graph=True, accum_steps=2, log_every=2))
    eng.fit(_batches(4))
    assert "accum_steps=2" in caplog.text and eng.graphed is None
    eng = Engine(SmallNet(10), EngineConfig(cuda_graph=True, log_every=2))
    data = _batches(4) + [(torch.randn(5, 3, 64, 64), torch.randint(0, 10, (5,)))]
    report = eng.fit(data)
    assert report["cuda_graph"] and report["steps"] == 5


def test_fp16_scaler_skips_inf_on_gpu():
    eng = Engine(SmallNet(10), EngineConfig(precision="fp16", log_every=1))
    x, y = _batches(1)[0]
    eng.fit([(x, y)])
    before = {k: v.clone() for k, v in eng.model.state_dict().items() if v.is_floating_point()}
    bad = x.clone()
    bad[0, 0, 0, 0] = float("inf")
    report = eng.fit([(bad, y)])
    assert report["nonfinite"] == 1
    after = eng.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if "running" not in k)


def test_nvml_sampler_reads_gpm_on_hopper():
    from fastdata.monitor.nvml import GpuSampler

    s = GpuSampler()
    assert s.available, s.reason
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with s:
        for _ in range(200):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
    summary = s.summary()
    assert summary["samples"] >= 1 and 0 <= summary["duty_cycle"] <= 100
    if s.gpm:
        assert 0 < summary["sm_util"] <= 100


def test_nvjpeg_backend_matches_full_resolution_pil(image_folder):
    """nvJPEG decodes at full resolution then resizes; compare against PIL doing the same (the PIL
    loader backend decodes in draft mode, a coarser picture: 0.106 apart on an H100)."""
    pytest.importorskip("torchvision")
    from fastdata.read.verbs import decode_loader

    ref, labels = pil_reference(image_folder)
    aug = AugmentConfig(size=64, train=False, crop_fraction=1.0)
    gpu = list(decode_loader(image_folder, 16, backend="nvjpeg", augment=aug, shuffle=False))
    assert gpu[0].source.startswith("nvjpeg") and gpu[0].images.is_cuda
    images = torch.cat([b.images.float().cpu() for b in gpu])
    assert torch.cat([b.labels.cpu() for b in gpu]).tolist() == labels
    diff = (images - ref).abs()
    print(f"nvJPEG vs full-resolution PIL: mean abs diff {diff.mean():.4f}, median {diff.median():.4f}")
    assert diff.mean() < 0.08 and diff.median() < 0.05, f"mean abs difference {diff.mean():.3f}"


def test_dali_mixed_matches_cpu_decode_and_keeps_order(image_folder):
    pytest.importorskip("nvidia.dali")
    from fastdata.read.verbs import decode_loader

    kw = dict(image_size=64, seed=0, train=False, shuffle=False)
    gpu = list(decode_loader(image_folder, 16, backend="dali", **kw))
    cpu = list(decode_loader(image_folder, 16, backend="cpu", device="cpu", **kw))
    assert gpu[0].source.startswith("dali-mixed") and gpu[0].images.is_cuda
    assert gpu[0].images.is_contiguous(memory_format=torch.channels_last)
    for a, b in zip(gpu, cpu):
        assert torch.equal(a.indices, b.indices) and torch.equal(a.labels.cpu(), b.labels)
        diff = (a.images.float().cpu() - b.images.float()).abs().mean()
        assert diff < 0.05, f"mean abs difference {diff:.3f} in normalised units (nvJPEG vs libjpeg)"


def test_dali_mixed_native_reader_and_feed_agree_across_epochs(image_folder):
    """The native file reader and the Python feed decode the same samples in the same order, two epochs
    running through one pipeline, labels on the GPU."""
    pytest.importorskip("nvidia.dali")
    from fastdata.read.verbs import decode_loader

    kw = dict(image_size=64, seed=4, train=False)
    native = decode_loader(image_folder, 16, backend="dali", file_reader="native", **kw)
    feed = decode_loader(image_folder, 16, backend="dali", file_reader="feed", **kw)
    for _ in range(2):
        for a, b in zip(native, feed, strict=True):
            assert a.labels.is_cuda and torch.equal(a.indices, b.indices) and torch.equal(a.labels, b.labels)
            assert torch.equal(a.images, b.images)


@pytest.mark.parametrize("backend,data", [("raw", "raw_cache"), ("raw", "variable_cache"), ("nvjpeg", "image_folder"),
                                          ("nvjpeg", "jpeg_cache")])
def test_resume_contract_on_the_gpu(backend, data, request):
    """The CPU suite's resume contract (tests/test_read_pipeline.py) for the backends that need CUDA."""
    if backend == "nvjpeg":
        pytest.importorskip("torchvision")
    from helpers import check_resume_contract

    path = request.getfixturevalue(data)

    def make(rank, world):
        return fastdata.loader(path, 16, backend=backend, device="cuda", seed=5, rank=rank, world_size=world,
                               augment=AugmentConfig(size=32, dtype="float32"))

    check_resume_contract(make, f"{backend}/{data}")


def test_triton_planar_kernel_reads_separate_chw_tensors():
    """Planar mode over separate CHW tensors (nvJPEG's output, addressed by byte offsets from the
    lowest one) against the eager reference on the same pixels packed as HWC."""
    from fastdata.read.augment import _norm_constants, apply_plan, plan_tensor
    from fastdata.read.augment_triton import crop_resize_normalise
    from fastdata.read.crop import draw_plan

    rng = np.random.default_rng(2)
    h, w = rng.integers(120, 300, 7), rng.integers(120, 300, 7)
    hwc = [torch.randint(0, 255, (int(a), int(b), 3), dtype=torch.uint8, device="cuda") for a, b in zip(h, w)]
    chw = [t.permute(2, 0, 1).contiguous() for t in hwc]
    cfg = AugmentConfig(size=128, dtype="float32", kernel="eager")
    plan = draw_plan(cfg, 5, h, w)                      # offsets: the HWC samples packed end to end
    ref = apply_plan(torch.cat([t.flatten() for t in hwc]), plan_tensor(plan, torch.device("cuda")), cfg)
    ptrs = np.array([t.data_ptr() for t in chw], dtype=np.int64)
    first = int(ptrs.argmin())
    plan[:, 4] = ptrs - ptrs[first]
    scale, shift = _norm_constants(cfg.mean, cfg.std, torch.device("cuda"))
    out = crop_resize_normalise(chw[first], plan_tensor(plan, torch.device("cuda")), 128, scale, shift,
                                torch.float32, planar=True)
    assert (out - ref).abs().max() < 1e-3


def test_nvjpeg_in_place_kernel_equals_packed_path(jpeg_cache):
    """The nvjpeg backend's one-kernel crop (Triton, planar, no packing copy) against its packed
    grid_sample path on the same draws: a JPEG cache near the output size takes the kernel."""
    pytest.importorskip("torchvision")
    pytest.importorskip("triton")
    outs = []
    for in_place in (True, False):
        dl = fastdata.loader(jpeg_cache, 16, backend="nvjpeg", device="cuda", seed=3,
                             augment=AugmentConfig(size=48, dtype="float32"))
        dl.backend._triton = in_place
        outs.append([b.images.float().cpu() for b in dl][:3])
    for a, b in zip(*outs):
        assert a.shape == b.shape
        assert (a - b).abs().max() < 2e-2


def test_nvjpeg_build_matches_the_cpu_build(image_folder, tmp_path):
    """build-cache --decoder nvjpeg on the real decoder: same samples, labels and order as the CPU build,
    verify passes, pixels within a few levels (nvJPEG's IDCT, full decode against libjpeg's draft)."""
    pytest.importorskip("torchvision")
    from fastdata.cache.verify import verify_cache
    from fastdata.read.reader import open_cache
    from helpers import build

    cpu = build(image_folder, tmp_path / "cpu", workers=2)
    gpu = build(image_folder, tmp_path / "gpu", decoder="nvjpeg")
    assert verify_cache(tmp_path / "gpu").ok and gpu.manifest.build["decoder"] == "nvjpeg"
    assert gpu.manifest.label_map == cpu.manifest.label_map and not gpu.manifest.quarantined
    a, b = open_cache(tmp_path / "cpu"), open_cache(tmp_path / "gpu")
    assert len(a) == len(b) and [a.raw(i)[1] for i in range(len(a))] == [b.raw(i)[1] for i in range(len(b))]
    diff = np.array([(a.raw(i)[0].float() - b.raw(i)[0].float()).abs().mean().item() for i in range(len(a))])
    print(f"nvjpeg build against the CPU build: mean abs difference {diff.mean():.2f}, worst {diff.max():.2f}")
    assert diff.mean() < 4.0 and diff.max() < 8.0


def test_nvjpeg_loader_turns_phone_photos_as_pil_does(tmp_path):
    """nvJPEG ignores EXIF orientation; the nvjpeg loader applies it (exif_turns + upright), so a folder of
    photos taken sideways reads as the pil backend reads it."""
    from helpers import exif_photos

    pytest.importorskip("torchvision")

    exif_photos(tmp_path / "src")
    aug = AugmentConfig(size=32, train=False, crop_fraction=1.0, dtype="float32")
    got = {}
    for backend in ("nvjpeg", "pil"):
        dl = fastdata.loader(tmp_path / "src", 4, backend=backend, device="cuda", shuffle=False, augment=aug)
        got[backend] = next(iter(dl)).images.float().cpu()
    diff = (got["nvjpeg"] - got["pil"]).abs().mean(dim=(1, 2, 3))
    print(f"nvjpeg vs pil per image (orientations 1, 6, 3, 8): {diff.tolist()}")
    # normalised units: resize filters differ by ~0.14 on this pattern (DALI against pil on the CPU box,
    # every orientation alike); a sideways image differs by ~1
    assert diff.max() < 0.4 and diff.max() - diff.min() < 0.1


def test_free_gpu_memory_from_nvml_agrees_with_cuda():
    """shard_processes asks NVML (no CUDA context in the parent); it must see what CUDA sees, give or take
    the context that mem_get_info itself opens."""
    from fastdata.cache.gpu_build import free_gpu_bytes

    nvml = free_gpu_bytes()
    cuda = torch.cuda.mem_get_info()[0]
    print(f"free GPU memory: NVML {nvml / 2**30:.2f} GiB, CUDA {cuda / 2**30:.2f} GiB")
    assert abs(nvml - cuda) < 2 << 30
