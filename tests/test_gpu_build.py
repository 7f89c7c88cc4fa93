"""build-cache --decoder nvjpeg (cache/gpu_build.py) on the CPU: nvJPEG is stood in for by PIL decoding
the stored pixels without turning them (as nvJPEG returns them), so everything around the decoder
runs as on a GPU: EXIF orientation, crop and resize, routing of what nvJPEG cannot decode to the CPU
codec, quarantine, fallback, the manifest. tests/gpu runs the real decoder."""
from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from fastdata.cache import gpu_build
from fastdata.cache.codecs import CodecConfig
from fastdata.cache.verify import verify_cache
from fastdata.errors import BuildError
from fastdata.read.reader import open_cache

from helpers import build

ROOT = Path(__file__).resolve().parents[1]


def pil_as_nvjpeg(datas):
    """(3, H, W) uint8 of each JPEG as stored: full decode, no EXIF turn (what nvJPEG returns)."""
    out = []
    for d in datas:
        try:
            img = Image.open(io.BytesIO(bytes(d))).convert("RGB")
        except OSError as e:            # torchvision raises RuntimeError for the whole batch
            raise RuntimeError(f"nvjpeg stand-in: {e}") from None
        out.append(torch.from_numpy(np.array(img)).permute(2, 0, 1).contiguous())
    return out


def _jpeg(arr: np.ndarray, orientation: int = 1, mode: str = "RGB") -> bytes:
    img = Image.fromarray(arr).convert(mode)
    buf = io.BytesIO()
    exif = Image.Exif()
    if orientation != 1:
        exif[0x0112] = orientation
    img.save(buf, "JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


@pytest.mark.parametrize("orientation", range(1, 9))
def test_orientation_turns_as_pil_exif_transpose(orientation):
    arr = np.random.default_rng(orientation).integers(0, 255, (40, 64, 3), dtype=np.uint8)
    data = _jpeg(arr, orientation)
    assert gpu_build.gpu_decodable(data) == orientation
    want = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))
    got = gpu_build.resize_like_codec(pil_as_nvjpeg([data])[0], orientation, CodecConfig(resize="none"))
    assert np.array_equal(got.numpy(), want)


def test_a_batch_is_resized_in_groups_with_the_bytes_of_one_image_at_a_time(monkeypatch):
    """resize_all_like_codec stacks crops of one size into one resize: same bytes as image by image,
    in the batch's order, for mixed sizes and turns (a turned 40x64 crops like a 64x40)."""
    import torch

    rng = np.random.default_rng(3)
    shapes = [(40, 64), (64, 40), (40, 64), (50, 50), (40, 64), (33, 71)]
    images = [torch.from_numpy(rng.integers(0, 255, (3, h, w), dtype=np.uint8)) for h, w in shapes]
    turns = [1, 1, 6, 1, 8, 3]
    for pixels in (1 << 26, 40 * 64 * 2):      # one call per size; and at most two crops a call
        monkeypatch.setattr(gpu_build, "GROUP_PIXELS", pixels)
        for codec in (CodecConfig(size=24), CodecConfig(size=24, resize="short"), CodecConfig(resize="none")):
            got = gpu_build.resize_all_like_codec(images, turns, codec)
            for x, o, g in zip(images, turns, got):
                assert torch.equal(g, gpu_build.resize_like_codec(x, o, codec))


def test_only_8bit_grey_or_colour_jpegs_go_to_the_gpu(photos):
    arr = next(iter(photos.values()))[:64, :64]
    png = io.BytesIO()
    Image.fromarray(arr).save(png, "PNG")
    assert gpu_build.gpu_decodable(_jpeg(arr, mode="L")) == 1
    assert gpu_build.gpu_decodable(_jpeg(arr, mode="CMYK")) is None
    assert gpu_build.gpu_decodable(png.getvalue()) is None
    assert gpu_build.gpu_decodable(b"\xff\xd8 not really") is None


@pytest.fixture(scope="module")
def messy_folder(image_folder, tmp_path_factory, photos):
    """The photo folder plus what a GPU decoder must hand to the CPU codec or quarantine."""
    src = tmp_path_factory.mktemp("gpu-src") / "images"
    shutil.copytree(image_folder, src)
    arr = next(iter(photos.values()))[:200, :300]
    cls = sorted(p for p in src.iterdir() if p.is_dir())[0]
    (cls / "zz_turned.jpg").write_bytes(_jpeg(arr, 6))
    (cls / "zz_grey.jpg").write_bytes(_jpeg(arr, mode="L"))
    (cls / "zz_cmyk.jpg").write_bytes(_jpeg(arr, mode="CMYK"))
    Image.fromarray(arr).save(cls / "zz_png.png")
    (cls / "zz_broken.jpg").write_bytes(_jpeg(arr)[:300])
    return src


def _pixels(path) -> tuple[list[str], np.ndarray]:
    cache = open_cache(path)
    keys = [k for s in range(len(cache.manifest.shards)) for k in cache.shard(s).keys]
    return keys, np.stack([cache.raw(i)[0].numpy() for i in range(len(cache))]).astype(np.int16)


def _gpu_build(monkeypatch, src, dest, decode=pil_as_nvjpeg, **kw):
    monkeypatch.setattr(gpu_build, "check_gpu_decoder", lambda: None)
    monkeypatch.setattr(gpu_build, "nvjpeg_decode", decode)
    monkeypatch.setattr(gpu_build, "BATCH", 16)          # several batches per shard
    kw.setdefault("workers", 0)      # shard threads in this process, where the patches above apply
    return build(src, dest, decoder="nvjpeg", **kw)


def test_gpu_build_matches_the_cpu_build(messy_folder, tmp_path, monkeypatch):
    cpu = build(messy_folder, tmp_path / "cpu", workers=2)
    gpu = _gpu_build(monkeypatch, messy_folder, tmp_path / "gpu")
    assert verify_cache(tmp_path / "gpu").ok
    assert [q["path"] for q in gpu.manifest.quarantined] == [q["path"] for q in cpu.manifest.quarantined]
    assert [q["path"].rsplit("/", 1)[-1] for q in gpu.manifest.quarantined] == ["zz_broken.jpg"]
    assert gpu.manifest.label_map == cpu.manifest.label_map
    assert gpu.manifest.build["decoder"] == "nvjpeg" and "decoder" not in cpu.manifest.build
    (ck, cp), (gk, gp) = _pixels(tmp_path / "cpu"), _pixels(tmp_path / "gpu")
    assert ck == gk
    diff = np.abs(cp - gp).reshape(len(ck), -1).mean(axis=1)
    # full decode + antialiased resize against libjpeg's reduced-scale decode + PIL's box resize
    print(f"mean abs difference per image: max {diff.max():.2f}, mean {diff.mean():.2f} (of 255)")
    assert diff.max() < 6.0 and diff.mean() < 3.0, (diff.max(), diff.mean())
    png = ck.index(next(k for k in ck if k.endswith("zz_png.png")))
    assert diff[png] == 0, "a PNG goes through the CPU codec: the same bytes as the CPU build"


def test_a_batch_the_decoder_refuses_goes_through_the_cpu_codec(messy_folder, tmp_path, monkeypatch):
    def refuse(datas):
        raise RuntimeError("nvjpeg: unsupported")

    cpu = build(messy_folder, tmp_path / "cpu", workers=2)
    _gpu_build(monkeypatch, messy_folder, tmp_path / "gpu", decode=refuse)
    (ck, cp), (gk, gp) = _pixels(tmp_path / "cpu"), _pixels(tmp_path / "gpu")
    assert ck == gk and np.array_equal(cp, gp)
    assert len(cpu.manifest.quarantined) == 1


def test_shard_processes_build_the_same_cache_as_shard_threads(messy_folder, tmp_path, monkeypatch):
    """--workers 2: two processes (from a forkserver), each handed the decoder (here the stand-in)."""
    threads = _gpu_build(monkeypatch, messy_folder, tmp_path / "threads")
    procs = _gpu_build(monkeypatch, messy_folder, tmp_path / "procs", workers=2, shard_size="300KB")
    assert verify_cache(tmp_path / "procs").ok and len(procs.manifest.shards) > 2
    assert [q["path"] for q in procs.manifest.quarantined] == [q["path"] for q in threads.manifest.quarantined]
    (tk, tp), (pk, pp) = _pixels(tmp_path / "threads"), _pixels(tmp_path / "procs")
    assert tk == pk and np.array_equal(tp, pp)


def test_cpu_processes_beside_gpu_ones_build_the_same_samples(messy_folder, tmp_path, monkeypatch):
    """FASTDATA_BUILD_CPU_PROCESSES=1 beside one GPU process: both take shards from one queue; the cache holds
    every sample once, quarantines as the GPU build does, and its pixels are the CPU codec's or the GPU's."""
    gpu = _gpu_build(monkeypatch, messy_folder, tmp_path / "gpu")
    monkeypatch.setenv("FASTDATA_BUILD_CPU_PROCESSES", "1")
    mixed = _gpu_build(monkeypatch, messy_folder, tmp_path / "mixed", workers=2, shard_size="300KB")
    assert verify_cache(tmp_path / "mixed").ok and len(mixed.manifest.shards) > 2
    assert [q["path"] for q in mixed.manifest.quarantined] == [q["path"] for q in gpu.manifest.quarantined]
    (gk, gp), (mk, mp) = _pixels(tmp_path / "gpu"), _pixels(tmp_path / "mixed")
    assert gk == mk and gp.shape == mp.shape
    assert np.abs(gp.astype(int) - mp.astype(int)).mean() < 3     # (draft decoding differs by a level or so)


def test_build_processes_take_their_roles_in_start_order(monkeypatch):
    """The first `gpu` processes decode on the GPU, the rest with the CPU codec (and never open CUDA)."""
    import multiprocessing as mp

    monkeypatch.setattr(gpu_build, "engine_decode", lambda: None)
    roles = mp.get_context("fork").Value("i", 0)
    got = []
    for _ in range(3):
        gpu_build._init_gpu_worker(None, pil_as_nvjpeg, roles, gpu=2)
        got.append(gpu_build._worker_decode)
    assert got == [pil_as_nvjpeg, pil_as_nvjpeg, gpu_build.CPU_ROLE]
    monkeypatch.setenv("FASTDATA_BUILD_CPU_PROCESSES", "two")
    with pytest.raises(BuildError, match="FASTDATA_BUILD_CPU_PROCESSES='two'"):
        gpu_build.process_split(4)


def test_three_in_eight_build_processes_decode_on_the_cpu(monkeypatch):
    """--workers N: 3N // 8 CPU-codec processes by default, the rest on the GPU as far as its memory goes,
    and the CPU codec takes the processes the GPU cannot hold; always one GPU process."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_build, "free_gpu_bytes", lambda: 1 << 50)
    monkeypatch.delenv("FASTDATA_BUILD_CPU_PROCESSES", raising=False)
    assert gpu_build.process_split(16) == (10, 6)
    assert gpu_build.process_split(3) == (2, 1)
    assert gpu_build.process_split(2) == (2, 0)
    assert gpu_build.process_split(0) == (0, 0)             # --workers 0: threads in this process
    monkeypatch.setenv("FASTDATA_BUILD_CPU_PROCESSES", "0")
    assert gpu_build.process_split(16) == (16, 0)
    monkeypatch.setenv("FASTDATA_BUILD_CPU_PROCESSES", "99")
    assert gpu_build.process_split(16) == (1, 15)
    monkeypatch.delenv("FASTDATA_BUILD_CPU_PROCESSES")
    monkeypatch.setattr(gpu_build, "free_gpu_bytes", lambda: 8 * gpu_build.PROCESS_GPU_BYTES)
    assert gpu_build.process_split(16) == (8, 8)


def test_a_script_without_a_main_guard_is_told_to_add_one(messy_folder, tmp_path):
    """The shard processes import the __main__ script first, as spawn does: an unguarded script would start
    the build again inside each of them, which multiprocessing refuses, and the pool breaks."""
    (tmp_path / "standin.py").write_text("from test_gpu_build import pil_as_nvjpeg as decode\n")
    script = tmp_path / "build_it.py"
    script.write_text(
        "import standin\nfrom fastdata.cache import gpu_build\nfrom fastdata.cache.build import BuildConfig, build_cache\n"
        "gpu_build.check_gpu_decoder = lambda: None\ngpu_build.nvjpeg_decode = standin.decode\n"
        f"build_cache(BuildConfig(src={str(messy_folder)!r}, dest={str(tmp_path / 'd')!r}, decoder='nvjpeg', "
        "workers=2, size=32, progress=False))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), str(ROOT / "tests")])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0
    assert 'BuildError: a build worker process died: if a script starts this build, put the call under ' \
           '`if __name__ == "__main__":`' in out.stderr, out.stderr[-2000:]
    lines = script.read_text().splitlines()       # the same script, guarded: it builds
    script.write_text("\n".join(lines[:-1] + ["if __name__ == '__main__':", "    " + lines[-1]]) + "\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert verify_cache(tmp_path / "d").ok


def test_shard_processes_are_capped_by_free_gpu_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_build, "free_gpu_bytes", lambda: 10 * gpu_build.PROCESS_GPU_BYTES + 1)
    assert gpu_build.shard_processes(16) == 10
    assert gpu_build.shard_processes(4) == 4
    assert gpu_build.shard_processes(0) == 0           # --workers 0: threads in this process
    monkeypatch.setattr(gpu_build, "free_gpu_bytes", lambda: 1 << 20)
    assert gpu_build.shard_processes(16) == 1          # a full GPU still gets one process (which may then
                                                       # end with the one-line out-of-memory message)


def test_free_gpu_memory_falls_back_to_cuda_where_nvml_is_missing(monkeypatch):
    import pynvml

    def missing():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    monkeypatch.setattr(pynvml, "nvmlInit", missing)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (7 << 30, 80 << 30))
    assert gpu_build.free_gpu_bytes() == 7 << 30


def test_on_error_raise_names_the_file(messy_folder, tmp_path, monkeypatch):
    with pytest.raises(BuildError, match="zz_broken.jpg"):
        _gpu_build(monkeypatch, messy_folder, tmp_path / "gpu", on_error="raise")


def test_one_bad_file_costs_its_batch_nothing(monkeypatch):
    """A file nvJPEG refuses fails its whole batch call; the batch is split until that file alone goes
    to the CPU codec (which quarantines it) and the rest are still decoded by the GPU decoder."""
    calls = []

    def counting(datas):
        calls.append(len(datas))
        return pil_as_nvjpeg(datas)

    arr = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    datas = [_jpeg(arr) for _ in range(8)]
    datas[5] = datas[5][:300]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:
        out = gpu_build.decode_batch(datas, CodecConfig(size=32), pool, counting)
    assert isinstance(out[5], str) and "cannot decode" in out[5]
    assert all(isinstance(o, tuple) and o[1] == (32, 32, 3) for k, o in enumerate(out) if k != 5)
    assert sum(n for n in calls if n == 1) <= 2 and max(calls) == 8


def test_decoder_calls_hold_a_bounded_number_of_pixels(monkeypatch):
    """Six shard threads each decoding 128 twelve-megapixel photos at once held 28 GB of GPU memory:
    a batch is decoded in runs of at most DECODE_PIXELS (by the headers), with the same results."""
    from concurrent.futures import ThreadPoolExecutor

    calls = []

    def counting(datas):
        calls.append(len(datas))
        return pil_as_nvjpeg(datas)

    rng = np.random.default_rng(1)
    datas = [_jpeg(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)) for _ in range(7)]
    datas.insert(3, _jpeg(rng.integers(0, 255, (96, 128, 3), dtype=np.uint8)))   # 4x the pixels
    with ThreadPoolExecutor(2) as pool:
        whole = gpu_build.decode_batch(datas, CodecConfig(size=32), pool, counting)
        assert calls == [8]
        monkeypatch.setattr(gpu_build, "DECODE_PIXELS", 3 * 48 * 64)
        calls.clear()
        parts = gpu_build.decode_batch(datas, CodecConfig(size=32), pool, counting)
    assert calls == [3, 1, 3, 1] and parts == whole


def test_running_out_of_gpu_memory_is_one_line_and_resumable(messy_folder, tmp_path, monkeypatch, capsys):
    """A CUDA OOM while resizing (another process on the GPU) was a traceback; now exit 2 with one line,
    and the rerun finishes the build."""
    from fastdata.cli import main

    real = gpu_build.resize_all_like_codec
    calls = []

    def oom_once(*a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 18.00 GiB")
        return real(*a, **kw)

    monkeypatch.setattr(gpu_build, "resize_all_like_codec", oom_once)
    monkeypatch.setattr(gpu_build, "check_gpu_decoder", lambda: None)
    monkeypatch.setattr(gpu_build, "nvjpeg_decode", pil_as_nvjpeg)
    monkeypatch.setattr(gpu_build, "BATCH", 4)
    args = ["build-cache", str(messy_folder), str(tmp_path / "d"), "--decoder", "nvjpeg", "--no-progress",
            "--shard-size", "64KB", "--workers", "0"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "the GPU ran out of memory on shard" in err and "rerun to resume" in err and "\n" not in err
    assert main(args) == 0 and verify_cache(tmp_path / "d").ok


def test_cli_without_a_gpu_is_one_line_and_makes_no_dest(image_folder, tmp_path):
    import subprocess
    import sys

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    dest = tmp_path / "cache"
    out = subprocess.run([sys.executable, "-m", "fastdata.cli", "build-cache", str(image_folder), str(dest),
                          "--decoder", "nvjpeg", "--no-progress"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and not dest.exists()
    assert out.stderr.strip().count("\n") == 0 and "--decoder nvjpeg needs a CUDA GPU" in out.stderr


def test_a_storage_error_names_the_input_it_came_from(messy_folder, tmp_path, monkeypatch):
    """A read that fails other than with a reason (an object store going away) stops the build and
    names the input whose read failed, not another one of its batch."""
    from fastdata.cache import jobs

    real = jobs.read_input

    def flaky(item, options):
        if item.path.endswith("zz_grey.jpg"):
            raise ConnectionError("endpoint went away")
        return real(item, options)

    monkeypatch.setattr(jobs, "read_input", flaky)
    with pytest.raises(BuildError, match="zz_grey.jpg"):
        _gpu_build(monkeypatch, messy_folder, tmp_path / "gpu")


def test_the_nvjpeg_loader_reads_each_photos_exif_turn():
    """nvJPEG ignores EXIF orientation: the nvjpeg loader gave sideways phone photos where pil and DALI
    turn them. Its reader threads now read each JPEG's turn, and the GPU thread applies upright()."""
    import torch

    from fastdata.cache.gpu_build import upright
    from fastdata.cache.jpeg_header import baseline_size, jpeg_scan
    from fastdata.read.backends.nvjpeg import exif_turns

    arr = np.random.default_rng(0).integers(0, 255, (40, 64, 3), dtype=np.uint8)
    batch = [jpeg_scan(np.frombuffer(_jpeg(arr, o), np.uint8)) for o in (1, 6, 1, 8)]
    assert exif_turns(batch).tolist() == [1, 6, 1, 8] and exif_turns([batch[0], batch[2]]) is None
    assert exif_turns([None, batch[1]]).tolist() == [1, 6]        # not a JPEG: taken as upright
    assert [baseline_size(scan=s) for s in batch] == [(40, 64)] * 4   # the frame as stored, from one scan
    x = torch.from_numpy(arr).permute(2, 0, 1)
    for o in (6, 8):
        ref = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(_jpeg(arr, o)))))
        assert tuple(upright(x, o).shape[1:]) == ref.shape[:2] == (64, 40)
