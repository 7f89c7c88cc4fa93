"""NvjpegOptions.cpu_share: the CPU's part of a batch (read/backends/cpu_share.py), without a GPU."""
from __future__ import annotations

import io
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from fastdata.cache.hw_decode import Planes
from fastdata.errors import LoaderError
from fastdata.read.backends import cpu_share
from fastdata.read.backends.cpu_share import cpu_count, decode_pixels, upload_planar
from fastdata.read.config import split_options
from helpers import random_jpeg as _jpeg


def _pil(data) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(bytes(data))).convert("RGB"))




def test_cpu_share_is_a_checked_option_of_the_nvjpeg_backend():
    assert split_options("nvjpeg", {}).cpu_share is None      # picked by decode_pool.resolve_share
    for bad in (-0.1, 1.5, "half", True, float("nan")):
        with pytest.raises(LoaderError, match="cpu_share"):
            split_options("nvjpeg", {"cpu_share": bad}).check()
    with pytest.raises(LoaderError, match="only backend nvjpeg takes it"):
        split_options("pil", {"cpu_share": 0.5})


@pytest.mark.parametrize("share,n,want", [(0.0, 256, 0), (0.4, 256, 102), (0.5, 3, 2), (1.0, 7, 7), (0.3, 0, 0)])
def test_cpu_count_rounds_the_share_of_the_batch(share, n, want):
    assert cpu_count(share, n) == want


def test_decoded_pixels_are_pils_back_to_back_and_a_bad_image_is_named():
    jpegs = [_jpeg(40, 30, 0), _jpeg(17, 9, 1), _jpeg(40, 30, 2)]
    h, w = np.array([30, 9, 30]), np.array([40, 17, 40])
    flat = decode_pixels(jpegs, h, w, lambda j: f"img{j}", pin=False).numpy()
    want = np.concatenate([_pil(j).reshape(-1) for j in jpegs])
    assert flat.dtype == np.uint8 and np.array_equal(flat, want)
    with pytest.raises(LoaderError, match=r"img1: .*header says 18x9"):
        decode_pixels(jpegs[:2], h[:2], np.array([40, 18]), lambda j: f"img{j}", pin=False)
    with pytest.raises(LoaderError, match=r"img0: .*build-cache"):
        decode_pixels([jpegs[0][:50]], h[:1], w[:1], lambda j: f"img{j}", pin=False)


def test_torchvisions_planar_images_are_copied_whatever_their_strides(monkeypatch):
    """torchvision's CPU decode_jpeg returns CHW views of HWC buffers: joining them with .view(-1) failed
    on the first batch on an H100 (2026-12-07). A stand-in torchvision.io returns such views here."""
    import sys

    def decode_jpeg(tensors, mode=None):
        return [torch.from_numpy(_pil(t.numpy()).copy()).permute(2, 0, 1) for t in tensors]

    fake = SimpleNamespace(decode_jpeg=decode_jpeg, ImageReadMode=SimpleNamespace(RGB="RGB"))
    monkeypatch.setitem(sys.modules, "torchvision", SimpleNamespace(io=fake))
    monkeypatch.setitem(sys.modules, "torchvision.io", fake)
    jpegs = [_jpeg(40, 30, 0), _jpeg(17, 9, 1)]
    h, w = np.array([30, 9]), np.array([40, 17])
    flat = cpu_share.decode_planes(jpegs, h, w, str, pin=False)
    assert np.array_equal(flat.numpy(), np.concatenate([_pil(j).transpose(2, 0, 1).reshape(-1) for j in jpegs]))


@pytest.mark.parametrize("sizes", [[(30, 40)] * 3, [(30, 40), (9, 17), (12, 12)]])
def test_uploaded_pixels_are_planar_images_at_their_offsets(sizes):
    """One transposing copy for a fixed-size batch, one per image otherwise: either way image i's planes
    start offsets[i] bytes after the base, as nvJPEG's Planes."""
    jpegs = [_jpeg(w, h, k) for k, (h, w) in enumerate(sizes)]
    h, w = np.array([s[0] for s in sizes]), np.array([s[1] for s in sizes])
    planes = upload_planar(decode_pixels(jpegs, h, w, str, pin=False), h, w, torch.device("cpu"))
    for k, (j, im) in enumerate(zip(jpegs, planes.images())):
        assert np.array_equal(im.numpy(), _pil(j).transpose(2, 0, 1))
        assert planes.base.data_ptr() + int(planes.offsets[k]) == im.data_ptr()
    assert planes.heights.tolist() == h.tolist() and planes.widths.tolist() == w.tolist()
    flat = torch.cat([torch.from_numpy(_pil(j).transpose(2, 0, 1).copy()).view(-1) for j in jpegs])
    ready = upload_planar(flat, h, w, torch.device("cpu"), planar=True)     # torchvision's layout: as it is
    for k, (j, im) in enumerate(zip(jpegs, ready.images())):
        assert np.array_equal(im.numpy(), _pil(j).transpose(2, 0, 1))


def test_joined_planes_address_both_allocations_from_the_lower_base():
    a = Planes.of_images([torch.full((3, 4, 5), 1, dtype=torch.uint8), torch.full((3, 2, 2), 2, dtype=torch.uint8)])
    b = Planes.of_images([torch.full((3, 6, 1), 3, dtype=torch.uint8)])
    for first, then in ((a, b), (b, a)):
        j = Planes.joined(first, then)
        images = j.images()
        assert [int(im[0, 0, 0]) for im in images] == [int(im[0, 0, 0]) for im in first.images() + then.images()]
        assert j.heights.tolist() == first.heights.tolist() + then.heights.tolist()
        assert j.offsets.min() >= 0
        assert all(j.base.data_ptr() + int(o) == im.data_ptr() for o, im in zip(j.offsets, images))


def test_the_cpu_takes_the_last_share_of_an_upright_batch_with_known_sizes(jpeg_cache, monkeypatch):
    """NvjpegBackend._split: the GPU keeps the first images (and their sizes); the CPU's are decoded
    in the reader thread; a batch without sizes or with turned images stays whole."""
    from fastdata.read.backends.nvjpeg import NvjpegBackend
    from fastdata.read.encoded import EncodedSource

    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **kw: empty(*a, **kw))  # no CUDA here
    monkeypatch.setattr(cpu_share, "DECODER", "pil")       # (no torchvision beside this torch)
    src = EncodedSource(jpeg_cache)
    counted = {}
    me = SimpleNamespace(_share=0.4, encoded=src, _procs=None, _count=lambda which, n: counted.__setitem__(which, n))
    idx = np.array([3, 0, 5, 1, 7])
    batch = src.get_spans(idx)
    sizes = batch.baseline_sizes()
    gpu, gpu_sizes, (pixels, h, w, planar) = NvjpegBackend._split(me, batch, idx, sizes, None)
    assert planar is False
    assert len(gpu) == 3 and counted == {"cpu": 2}
    assert all(np.array_equal(x, y) for x, y in zip(gpu.arrays(), batch.arrays()[:3]))
    assert gpu_sizes[0].tolist() == sizes[0][:3].tolist() and h.tolist() == sizes[0][3:].tolist()
    want = np.concatenate([_pil(a).reshape(-1) for a in batch.arrays()[3:]])
    assert np.array_equal(pixels.numpy(), want) and w.tolist() == sizes[1][3:].tolist()
    for whole in (NvjpegBackend._split(me, batch, idx, None, None),
                  NvjpegBackend._split(me, batch, idx, sizes, np.array([1, 6, 1, 1, 1]))):
        assert whole[0] is batch and whole[2] is None


def test_with_a_cpu_share_every_reader_thread_gets_a_batch_to_decode():
    """One reader thread decodes a whole batch's share, so the default read-ahead (4 batches) left 10 of
    threads=14 idle: with a share the default grows to the thread count; a given prefetch is kept."""
    from fastdata.read.config import LoaderConfig, NvjpegOptions

    def cfg(**kw):
        share = kw.pop("share", 0.0)
        return LoaderConfig(batch_size=256, backend="nvjpeg", options=NvjpegOptions(cpu_share=share), **kw).check()

    assert cfg(threads=14).read_ahead == 4
    assert cfg(threads=14, share=1.0).read_ahead == 14
    assert cfg(threads=2, share=0.5).read_ahead == 4
    assert cfg(threads=14, share=0.5, prefetch=3).read_ahead == 3
    # a share left to the backend (None) widens nothing here: the backend does once it has picked one, so
    # a folder of JPEG files (share 0) reads no further ahead than without a share
    assert cfg(threads=14, share=None).read_ahead == 4
