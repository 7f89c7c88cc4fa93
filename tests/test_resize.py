"""The packed crop-resize of the GPU-decode fallback against PIL's own crop+resize, on CPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fastdata.read.backends.gpu_resize import crop_resize, pack


def _chw(photo: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(photo)).permute(2, 0, 1).contiguous()


@pytest.mark.parametrize("size,limit", [(224, 2.5), (64, 4.5)])
def test_matches_pil_crop_resize_on_mixed_sizes(photos, size, limit):
    images = [_chw(p) for p in list(photos.values())[:6]]
    rng = np.random.default_rng(0)
    boxes, refs = [], []
    for im in images:
        h, w = im.shape[1:]
        ch, cw = int(rng.integers(h // 3, h)), int(rng.integers(w // 3, w))
        t, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        boxes.append([t, left, ch, cw])
        pil = Image.fromarray(im.permute(1, 2, 0).numpy()).resize((size, size), Image.BILINEAR,
                                                                   box=(left, t, left + cw, t + ch))
        refs.append(torch.from_numpy(np.array(pil)).permute(2, 0, 1).float())
    flips = torch.tensor([k % 2 == 1 for k in range(len(images))])
    packed, sizes = pack(images)
    assert packed.shape[0] == len(images) and sizes.tolist() == [list(im.shape[1:]) for im in images]
    out = crop_resize(packed, sizes, torch.tensor(boxes), size, flips)
    ref = torch.stack(refs)
    ref = torch.where(flips.view(-1, 1, 1, 1), ref.flip(3), ref)
    assert out.shape == (len(images), 3, size, size)
    diff = (out - ref).abs()
    assert diff.mean() < limit, f"mean abs difference {diff.mean():.2f} of 255"


def test_whole_image_at_its_own_size_is_unchanged(photos):
    im = _chw(next(iter(photos.values())))[:, :96, :96]
    other = _chw(next(iter(photos.values())))[:, :200, :150]          # a larger neighbour pads the batch
    packed, sizes = pack([im, other])
    out = crop_resize(packed, sizes, torch.tensor([[0, 0, 96, 96], [0, 0, 200, 150]]), 96)
    assert torch.allclose(out[0], im.float(), atol=1e-3)             # padding never bleeds into the edges


def test_pack_spans_bound_the_padded_batch():
    """A folder's 12 MP phone photos packed 256 at a time made a 9 GB batch (and a 37 GB float copy)."""
    from fastdata.read.backends.gpu_resize import pack_spans

    assert pack_spans([10] * 8, limit=1000) == [(0, 8)]                   # small images: one part
    assert pack_spans([10, 10, 500, 10], limit=1000) == [(0, 2), (2, 4)]  # 3 x 500 > 1000 pads too much
    assert pack_spans([2000, 10], limit=1000) == [(0, 1), (1, 2)]         # one image over the limit: alone
    assert pack_spans([], limit=1000) == []
    for pixels in ([7, 300, 20, 20, 450, 3, 3, 3], [999] * 5):
        spans = pack_spans(pixels, limit=1000)
        assert [i for lo, hi in spans for i in range(lo, hi)] == list(range(len(pixels)))
        assert all(hi - lo == 1 or (hi - lo) * max(pixels[lo:hi]) <= 1000 for lo, hi in spans)


def test_nvjpeg_augment_packs_a_batch_of_large_photos_in_parts(monkeypatch):
    """The nvjpeg backend's packed path (no Triton, or crops too large for its kernel) now packs in
    bounded parts; each part is the same crop_resize of its images, in the batch's order."""
    from types import SimpleNamespace

    import fastdata.read.backends.gpu_resize as gr
    from fastdata.read.backends.nvjpeg import NvjpegBackend
    from fastdata.read.config import AugmentConfig
    from fastdata.cache.hw_decode import Planes

    rng = np.random.default_rng(0)
    decoded = [torch.from_numpy(rng.integers(0, 255, (3, h, w), dtype=np.uint8)) for h, w in
               [(120, 90), (64, 64), (200, 150), (90, 120), (64, 80)]]
    aug = AugmentConfig(size=32, dtype="float32", channels_last=False)
    fake = SimpleNamespace(cfg=SimpleNamespace(augment=aug), _triton=False, device=torch.device("cpu"))
    flips = torch.tensor([True, False, True, False, False])
    whole = NvjpegBackend._augment(fake, Planes.of_images(decoded), np.random.default_rng(1), flips)
    monkeypatch.setattr(gr, "PACK_PIXELS", 2 * 200 * 150)
    parts = NvjpegBackend._augment(fake, Planes.of_images(decoded), np.random.default_rng(1), flips)
    assert whole.shape == parts.shape == (5, 3, 32, 32) and torch.isfinite(parts).all()
    for lo, hi in gr.pack_spans([im.shape[1] * im.shape[2] for im in decoded]):
        assert hi - lo < 5
    # the first part chose the whole batch's prefilter: the same pixels up to float rounding of the
    # sampling grid (another padded size), far under one level (1/58 of a normalised unit)
    assert torch.allclose(whole[:2], parts[:2], atol=2e-3)


def test_nvjpeg_out_of_memory_is_not_called_a_bad_file(monkeypatch):
    """decode_jpeg's CUDA OOM was reported as "could not decode a sample ... quarantine bad files"."""
    import sys
    import types
    from types import SimpleNamespace

    from fastdata.errors import LoaderError
    from fastdata.read.backends.nvjpeg import NvjpegBackend
    from fastdata.read.spans import EncodedBatch

    def oom(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.20 GiB")

    io = types.ModuleType("torchvision.io")
    io.decode_jpeg, io.ImageReadMode = oom, SimpleNamespace(RGB=0)
    monkeypatch.setitem(sys.modules, "torchvision", types.ModuleType("torchvision"))
    monkeypatch.setitem(sys.modules, "torchvision.io", io)
    fake = SimpleNamespace(_count=lambda which, n: None, device=torch.device("cpu"))
    with pytest.raises(LoaderError, match="ran out of memory decoding a batch of 2 JPEGs.*lower batch_size") as e:
        NvjpegBackend._decode(fake, EncodedBatch.of_arrays([np.zeros(4, np.uint8)] * 2, [0, 0]), np.arange(2),
                              None, {"hw": None})
    assert "quarantine" not in str(e.value)
