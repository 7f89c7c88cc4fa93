"""Decoding in a child process (backends/process.py), on the CPU with the pil backend: the same
batches as in process, no main guard needed, failures surface as LoaderErrors, nothing left running."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import fastdata
from fastdata.errors import LoaderError
from fastdata.read.augment import AugmentConfig

AUG = AugmentConfig(size=32, dtype="float32")


def _loader(path, process: bool, **kw):
    return fastdata.loader(path, 16, backend="pil", device="cpu", seed=7, augment=AUG, threads=2,
                           process=process, **kw)


def _epochs(dl, n: int) -> list:
    return [(b.indices.tolist(), b.images.clone(), b.labels.clone()) for _ in range(n) for b in dl]


def test_child_process_yields_the_in_process_batches(jpeg_cache):
    ref = _loader(jpeg_cache, False)
    dl = _loader(jpeg_cache, True)
    try:
        assert type(dl.backend).__name__ == "ProcessBackend" and dl.backend.kind == "pil"
        got, want = _epochs(dl, 2), _epochs(ref, 2)
        assert len(got) == len(want) > 2
        for (gi, gx, gy), (wi, wx, wy) in zip(got, want):
            assert gi == wi
            assert torch.equal(gy, wy)
            assert gx.dtype == wx.dtype and gx.stride() == wx.stride() and torch.equal(gx, wx)
        assert dl.state_dict()["backend"] == ref.state_dict()["backend"] == "pil"
    finally:
        dl.close()
    assert dl.backend._proc.poll() is not None, "close() leaves no decoding process behind"


def test_early_break_then_next_epoch_and_a_kept_batch(jpeg_cache):
    """A pass left early is followed by the next epoch (torch DataLoader semantics), and a batch the
    user keeps is not overwritten by later ones (the ring slot is cloned out)."""
    ref = _epochs(_loader(jpeg_cache, False), 2)
    n = len(ref) // 2
    dl = _loader(jpeg_cache, True)
    try:
        it = iter(dl)
        kept = next(it)
        kept_pixels = kept.images.clone()
        next(it)
        del it
        second = [(b.indices.tolist(), b.images) for b in dl]
        assert [s[0] for s in second] == [r[0] for r in ref[n:]]
        assert torch.equal(kept.images, kept_pixels) and torch.equal(kept.images, ref[0][1])
    finally:
        dl.close()


def test_a_script_without_a_main_guard_decodes_in_a_child(jpeg_cache, tmp_path):
    """multiprocessing's spawn would re-run this script in the child and fail; ours starts a fresh
    interpreter that imports only fastdata."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(f"""
        import fastdata
        from fastdata.read.augment import AugmentConfig
        dl = fastdata.loader({str(jpeg_cache)!r}, 16, backend="pil", device="cpu", process=True,
                             augment=AugmentConfig(size=32))
        print("batches", sum(1 for _ in dl))
        dl.close()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["batches", str(len(_loader(jpeg_cache, False)))]


def test_a_bad_image_in_the_child_is_a_loader_error_naming_it(image_folder, tmp_path):
    import shutil

    folder = tmp_path / "folder"
    shutil.copytree(image_folder, folder)
    victim = sorted(folder.rglob("*.jpg"))[3]
    victim.write_bytes(victim.read_bytes()[:200])          # truncated: header only
    in_process = _loader(folder, False, shuffle=False)
    with pytest.raises(LoaderError) as want:
        list(in_process)
    dl = _loader(folder, True, shuffle=False)
    try:
        with pytest.raises(LoaderError) as got:
            list(dl)
        assert victim.name in str(got.value) and str(got.value) == str(want.value)
    finally:
        dl.close()


def test_a_dead_child_is_a_loader_error(jpeg_cache):
    dl = _loader(jpeg_cache, True)
    try:
        it = iter(dl)
        next(it)
        dl.backend._proc.kill()
        dl.backend._proc.wait()
        with pytest.raises(LoaderError, match="decoding process"):
            for _ in range(100):
                next(it)
    finally:
        dl.close()


def test_process_applies_to_decoding_backends_and_paths(raw_cache, jpeg_cache):
    with pytest.raises(LoaderError, match="process=True applies to backends nvjpeg, pil"):
        fastdata.loader(raw_cache, 16, backend="raw", device="cpu", process=True)
    with pytest.raises(LoaderError, match="needs a folder or cache path"):
        fastdata.loader([1, 2], 16, backend="pil", device="cpu", process=True)
    assert type(_loader(jpeg_cache, False).backend).__name__ == "PilBackend"
    default = fastdata.loader(jpeg_cache, 16, backend="pil", device="cpu", augment=AUG)
    assert default.cfg.process is False, "process mode is on by default only for nvjpeg on a GPU"
