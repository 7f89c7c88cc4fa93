"""Crop plans (fastdata/read/crop.py): torchvision's RandomResizedCrop distribution, determinism,
and the plan applied to fixed-shape and packed variable-shape batches."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from fastdata.read.augment import AugmentConfig, apply_plan, augment_batch, plan_tensor
from fastdata.read.crop import draw_plan, random_boxes
from fastdata.errors import LoaderError


def _torchvision_get_params(h, w, scale, ratio, rnd: random.Random):
    """A line-for-line copy of torchvision.transforms.RandomResizedCrop.get_params (torchvision 0.2x),
    with python's random in place of torch's: the reference distribution (torchvision is not a
    dependency and does not install beside this torch)."""
    area = h * w
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rnd.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rnd.uniform(log_ratio[0], log_ratio[1]))
        cw = int(round(math.sqrt(target_area * aspect_ratio)))
        ch = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            i = rnd.randint(0, h - ch)
            j = rnd.randint(0, w - cw)
            return i, j, ch, cw
    in_ratio = float(w) / float(h)
    if in_ratio < min(ratio):
        cw, ch = w, int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        ch, cw = h, int(round(h * max(ratio)))
    else:
        cw, ch = w, h
    return (h - ch) // 2, (w - cw) // 2, ch, cw


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    grid = np.sort(np.concatenate([a, b]))
    ca = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    cb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(ca - cb).max())


@pytest.mark.parametrize("h,w", [(256, 256), (300, 500), (60, 400), (20, 24)])
def test_random_boxes_follow_torchvision_distribution(h, w):
    """Area fraction, aspect, offsets and the fallback share match torchvision's get_params. 20k draws
    each: the KS statistic of two equal samples stays under 0.03 with p > 0.999 (critical value
    1.95 * sqrt(2 / 20000) = 0.0276), so a wrong distribution fails and a right one does not."""
    n, scale, ratio = 20000, (0.08, 1.0), (3 / 4, 4 / 3)
    rnd = random.Random(0)
    ref = np.array([_torchvision_get_params(h, w, scale, ratio, rnd) for _ in range(n)], dtype=np.float64)
    ours = random_boxes(np.random.default_rng(1), np.full(n, h), np.full(n, w), scale, ratio).astype(np.float64)
    assert ((ours[:, 0] >= 0) & (ours[:, 0] + ours[:, 2] <= h)).all()
    assert ((ours[:, 1] >= 0) & (ours[:, 1] + ours[:, 3] <= w)).all()
    for name, f in {"area": lambda b: b[:, 2] * b[:, 3] / (h * w), "aspect": lambda b: b[:, 3] / b[:, 2],
                    "top": lambda b: b[:, 0] / h, "left": lambda b: b[:, 1] / w}.items():
        assert _ks(f(ours), f(ref)) < 0.03, name
    centred = lambda b: np.mean((b[:, 0] == (h - b[:, 2]) // 2) & (b[:, 1] == (w - b[:, 3]) // 2))
    assert abs(centred(ours) - centred(ref)) < 0.03


def test_fallback_is_torchvision_centre_crop():
    """A 10 x 400 strip admits no box of aspect in [3/4, 4/3] at scale >= 0.5: every draw falls back."""
    boxes = random_boxes(np.random.default_rng(0), np.full(50, 10), np.full(50, 400), (0.5, 1.0), (3 / 4, 4 / 3))
    ref = _torchvision_get_params(10, 400, (0.5, 1.0), (3 / 4, 4 / 3), random.Random(0))
    assert (boxes == np.array(ref)).all()


def test_plan_is_a_function_of_seed_and_sizes():
    cfg = AugmentConfig(size=32)
    h, w = np.array([40, 50, 60]), np.array([70, 50, 30])
    assert np.array_equal(draw_plan(cfg, 7, h, w), draw_plan(cfg, 7, h, w))
    assert not np.array_equal(draw_plan(cfg, 7, h, w), draw_plan(cfg, 8, h, w))
    assert np.array_equal(draw_plan(cfg, 2**70 + 3, h, w), draw_plan(cfg, 2**70 + 3, h, w))  # big seeds wrap


def test_full_box_plan_reproduces_image_and_its_mirror():
    img = torch.randint(0, 255, (64, 8, 8, 3), dtype=torch.uint8)
    cfg = AugmentConfig(size=8, scale=(1.0, 1.0), ratio=(1.0, 1.0), mean=(0, 0, 0), std=(1 / 255,) * 3)
    out = augment_batch(img, cfg, seed=4).permute(0, 2, 3, 1)
    flipped = [torch.allclose(o, i.flip(1).float(), atol=1e-3) for o, i in zip(out, img)]
    same = [torch.allclose(o, i.float(), atol=1e-3) for o, i in zip(out, img)]
    assert all(a or b for a, b in zip(same, flipped)) and 10 < sum(flipped) < 54


def test_packed_variable_shapes_equal_one_at_a_time():
    """A flat buffer of samples of different shapes, augmented by one plan, gives what each sample
    gives alone with its own plan row."""
    rng = np.random.default_rng(0)
    shapes = [(30, 50), (64, 40), (17, 90)]
    imgs = [torch.from_numpy(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for h, w in shapes]
    flat = torch.cat([i.reshape(-1) for i in imgs])
    cfg = AugmentConfig(size=24)
    h, w = np.array([s[0] for s in shapes]), np.array([s[1] for s in shapes])
    plan = draw_plan(cfg, 11, h, w)
    packed = apply_plan(flat, plan_tensor(plan, flat.device), cfg)
    assert packed.shape == (3, 3, 24, 24) and packed.is_contiguous(memory_format=torch.channels_last)
    for k, one in enumerate(imgs):
        row = plan[k:k + 1].copy()
        row[0, 4] = 0
        alone = apply_plan(one[None].contiguous(), torch.from_numpy(row), cfg)
        assert torch.allclose(packed[k], alone[0], atol=1e-5)


def test_unknown_kernel_and_triton_on_cpu_are_clear_errors():
    with pytest.raises(LoaderError, match="choose one of"):
        AugmentConfig(kernel="cuda")
    img = torch.zeros(1, 8, 8, 3, dtype=torch.uint8)
    with pytest.raises(LoaderError, match="kernel='auto'"):
        augment_batch(img, AugmentConfig(size=4, kernel="triton"))


def test_batch_crop_boxes_match_the_per_image_rule():
    """crop_boxes (one draw per batch, used by the nvJPEG backend) keeps crop_box's rule: eval boxes are
    identical, train boxes lie inside the image with the scale and ratio bounds, and a seed repeats them."""
    from fastdata.read.augment import AugmentConfig
    from fastdata.read.crop_box import crop_box, crop_boxes

    h, w = np.array([375, 500, 64, 333]), np.array([500, 375, 64, 500])
    ev = AugmentConfig(size=64, train=False)
    rng = np.random.default_rng(0)
    assert crop_boxes(h, w, ev, rng).tolist() == [list(crop_box(a, b, ev, rng)) for a, b in zip(h, w)]
    tr = AugmentConfig(size=64)
    boxes = crop_boxes(np.repeat(h, 500), np.repeat(w, 500), tr, np.random.default_rng(1))
    hh, ww = np.repeat(h, 500), np.repeat(w, 500)
    top, left, bh, bw = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + bh <= hh).all() and (left + bw <= ww).all()
    area = bh * bw / (hh * ww)
    assert area.min() >= 0.08 * 0.9 and area.max() <= 1.0
    again = crop_boxes(np.repeat(h, 500), np.repeat(w, 500), tr, np.random.default_rng(1))
    assert np.array_equal(boxes, again)
