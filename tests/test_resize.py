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
