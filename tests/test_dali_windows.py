"""Crop windows drawn on the host for DALI's fed path (JPEG caches, fed files): header sizes, and the
pixels DALI decodes are the windows the nvjpeg backend would draw for the same batch."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastdata.read.augment import AugmentConfig, normalize
from fastdata.read.backends.dali_crop import host_windows, image_size
from fastdata.read.crop_box import crop_boxes


def _encode(img: Image.Image, fmt: str, **kw) -> np.ndarray:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


@pytest.mark.parametrize("kw", [{}, {"progressive": True}, {"exif": Image.Exif().tobytes()}, {"quality": 30}])
def test_image_size_reads_jpeg_headers(kw):
    img = Image.new("RGB", (123, 77), (10, 200, 30))
    assert image_size(_encode(img, "JPEG", **kw)) == (77, 123)
    assert image_size(_encode(Image.new("L", (5, 300)), "JPEG")) == (300, 5)


def test_image_size_other_formats_and_garbage():
    assert image_size(_encode(Image.new("RGB", (40, 30)), "PNG")) == (30, 40)
    assert image_size(np.frombuffer(b"\xff\xd8\xff\xe0 truncated", dtype=np.uint8)) == (1, 1)
    assert image_size(np.zeros(10, np.uint8)) == (1, 1)


def test_host_windows_are_the_nvjpeg_draws():
    aug = AugmentConfig(size=32)
    encoded = [_encode(Image.new("RGB", (w, h)), "JPEG") for w, h in ((64, 48), (200, 100), (33, 90))]
    anchor, shape, mirror = host_windows(encoded, None, aug, np.random.default_rng(4))
    rng = np.random.default_rng(4)
    flips = rng.random(3) < 0.5
    boxes = crop_boxes([48, 100, 90], [64, 200, 33], aug, rng)   # (top, left, height, width)
    assert np.array_equal(anchor, boxes[:, [1, 0]]) and np.array_equal(shape, boxes[:, [3, 2]])
    assert np.array_equal(mirror.astype(bool), flips)
    fixed = host_windows(encoded, (48, 64), aug, np.random.default_rng(4))     # a cache's fixed shape
    assert (fixed[0][:, 0] + fixed[1][:, 0] <= 64).all() and (fixed[0][:, 1] + fixed[1][:, 1] <= 48).all()


def test_dali_fed_crops_decode_the_planned_windows(jpeg_cache):
    """DALI (CPU) on a JPEG cache against PIL decoding the same windows: the windows are wired right
    (sorted draw order, x/y and w/h order, flips) when the pixels agree."""
    pytest.importorskip("nvidia.dali")
    import fastdata
    from fastdata.read.backends.decode import batch_rng
    from fastdata.read.encoded import EncodedSource

    aug = AugmentConfig(size=24, dtype="float32", channels_last=False)
    bs = 16
    source = EncodedSource(jpeg_cache)
    for k, batch in enumerate(fastdata.loader(jpeg_cache, bs, backend="dali", device="cpu", seed=3, augment=aug)):
        idx = np.sort(batch.indices.numpy())
        rng = batch_rng(3, (0, k * bs), bs)
        flips = rng.random(len(idx)) < 0.5
        sizes = [Image.open(io.BytesIO(source.get(i)[0].tobytes())).size for i in idx]
        boxes = crop_boxes([h for _, h in sizes], [w for w, _ in sizes], aug, rng)
        ref = []
        for i, (t, left, h, w), flip in zip(idx, boxes, flips):
            img = Image.open(io.BytesIO(source.get(i)[0].tobytes())).convert("RGB")
            img = img.resize((24, 24), Image.BILINEAR, box=(left, t, left + w, t + h))
            ref.append(np.asarray(img.transpose(Image.FLIP_LEFT_RIGHT) if flip else img))
        ref = normalize(__import__("torch").from_numpy(np.stack(ref)), aug)
        got = batch.images[np.argsort(batch.indices.numpy())].float()
        diff = (got - ref).abs()
        assert diff.mean() < 0.1, f"batch {k}: mean abs difference {diff.mean():.3f}"
        if k == 1:
            break
