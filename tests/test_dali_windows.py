"""Crop windows drawn on the host for DALI's fed path (JPEG caches, fed files): header sizes, and the
pixels DALI decodes are the windows the nvjpeg backend would draw for the same batch."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastdata.read.augment import AugmentConfig, normalize
from fastdata.read.backends.dali_crop import batch_windows, host_windows
from fastdata.read.header import image_size
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


@pytest.mark.parametrize("orientation,turned", [(1, False), (3, False), (6, True), (8, True)])
@pytest.mark.parametrize("order", ["little", "big"])
def test_image_size_follows_exif_orientation(orientation, turned, order):
    """DALI's decoders turn an image by its EXIF orientation, so its crop window must fit the turned
    size (a window for the stored size fails: 'cropping window ... is not valid')."""
    exif = Image.Exif()
    exif[0x0112] = orientation
    raw = exif.tobytes()
    if order == "big":    # PIL writes little-endian; rebuild the same single-entry IFD big-endian
        raw = (b"Exif\0\0MM\0\x2a\0\0\0\x08\0\x01" + (0x0112).to_bytes(2, "big") + (3).to_bytes(2, "big")
               + (1).to_bytes(4, "big") + orientation.to_bytes(2, "big") + b"\0\0" + b"\0\0\0\0")
    data = _encode(Image.new("RGB", (120, 40)), "JPEG", exif=raw)
    assert image_size(data) == ((120, 40) if turned else (40, 120))


def test_image_size_other_formats_and_garbage():
    assert image_size(_encode(Image.new("RGB", (40, 30)), "PNG")) == (30, 40)
    assert image_size(np.frombuffer(b"\xff\xd8\xff\xe0 truncated", dtype=np.uint8)) == (1, 1)
    assert image_size(np.zeros(10, np.uint8)) == (1, 1)


def test_host_windows_are_the_nvjpeg_draws():
    aug = AugmentConfig(size=32)
    h, w = [48, 100, 90], [64, 200, 33]
    anchor, shape, mirror = host_windows(h, w, aug, np.random.default_rng(4))
    rng = np.random.default_rng(4)
    flips = rng.random(3) < 0.5
    boxes = crop_boxes(h, w, aug, rng)   # (top, left, height, width)
    assert np.array_equal(anchor, boxes[:, [1, 0]]) and np.array_equal(shape, boxes[:, [3, 2]])
    assert np.array_equal(mirror.astype(bool), flips)
    assert ((anchor + shape) <= np.stack([w, h], 1)).all() and (anchor >= 0).all()


def test_batch_windows_follow_the_sample_not_its_place_in_the_plan():
    """Windows are drawn over the batch in sorted index order: a sample gets the same window wherever
    the plan puts it, and padding repeats the last sample's window."""
    aug = AugmentConfig(size=32)
    idx = np.array([7, 2, 9, 4])
    h, w = np.array([50, 60, 70, 80]), np.array([90, 100, 110, 120])
    a = batch_windows(idx, h, w, aug, 1, (0, 0), 4)
    perm = np.array([2, 0, 3, 1])
    b = batch_windows(idx[perm], h[perm], w[perm], aug, 1, (0, 0), 4, rows=6)
    for got, ref in zip(b, a):
        assert np.array_equal(got[:4], ref[perm]) and np.array_equal(got[4:], np.repeat(ref[perm][-1:], 2, 0))


@pytest.mark.parametrize("backend,data,reader", [("dali", "jpeg_cache", "feed"), ("dali", "image_folder", "native"),
                                                 ("dali", "image_folder", "feed"), ("pil", "jpeg_cache", None),
                                                 ("pil", "image_folder", None)])
def test_crops_decode_the_planned_windows(backend, data, reader, request):
    """DALI (CPU) and the pil backend against PIL decoding the windows nvjpeg would draw, at full
    resolution: the windows are wired right (sorted draw order, x/y and w/h order, flips) when the
    pixels agree, and pil's reduced-scale decode keeps the box's resolution."""
    if backend == "dali":
        pytest.importorskip("nvidia.dali")
    import torch

    import fastdata
    from fastdata.read.backends.decode import batch_rng
    from fastdata.read.encoded import EncodedSource

    path = request.getfixturevalue(data)
    aug = AugmentConfig(size=24, dtype="float32", channels_last=False)
    bs = 16
    source = EncodedSource(path)
    opts = {"file_reader": reader} if reader else {}
    loader = fastdata.loader(path, bs, backend=backend, device="cpu", seed=3, augment=aug, **opts)
    for k, batch in enumerate(loader):
        idx = np.sort(batch.indices.numpy())
        rng = batch_rng(3, (0, k * bs), bs)
        flips = rng.random(len(idx)) < 0.5
        images = [Image.open(io.BytesIO(source.get(i)[0].tobytes())).convert("RGB") for i in idx]
        boxes = crop_boxes([im.height for im in images], [im.width for im in images], aug, rng)
        ref = []
        for img, (t, left, h, w), flip in zip(images, boxes, flips):
            img = img.resize((24, 24), Image.BILINEAR, box=(left, t, left + w, t + h))
            ref.append(np.asarray(img.transpose(Image.FLIP_LEFT_RIGHT) if flip else img))
        ref = normalize(torch.from_numpy(np.stack(ref)), aug)
        got = batch.images[np.argsort(batch.indices.numpy())].float()
        diff = (got - ref).abs()
        assert diff.mean() < 0.1, f"batch {k}: mean abs difference {diff.mean():.3f}"
        if k == 1:
            break


@pytest.mark.parametrize("reader", ["native", "feed"])
def test_dali_train_crops_fit_exif_turned_photos(tmp_path, reader):
    """Phone photos stored sideways with an EXIF orientation: every window fits the turned image."""
    pytest.importorskip("nvidia.dali")
    import fastdata

    exif = Image.Exif()
    exif[0x0112] = 6
    for c in range(2):
        (tmp_path / f"c{c}").mkdir()
        for k in range(6):
            Image.new("RGB", (160 + 10 * k, 40), (40 * k, 90, 200)).save(tmp_path / f"c{c}" / f"{k}.jpg",
                                                                       exif=exif.tobytes())
    loader = fastdata.loader(tmp_path, 4, backend="dali", device="cpu", augment=AugmentConfig(size=16),
                             file_reader=reader)
    assert sum(len(b.labels) for b in loader) == 12


def test_image_size_of_a_turned_png_without_decoding_it(monkeypatch):
    exif = Image.Exif()
    exif[0x0112] = 8
    data = _encode(Image.new("RGB", (50, 20)), "PNG", exif=exif.tobytes())
    monkeypatch.setattr(Image.Image, "load", lambda self: (_ for _ in ()).throw(AssertionError("decoded")))
    assert image_size(data) == (50, 20)


def test_header_sizes_read_the_head_and_the_whole_file_only_when_needed(tmp_path):
    """A frame header behind 100 KB of ICC profile is found by reading the whole file; an ordinary
    JPEG costs only its first bytes."""
    from fastdata.read.backends.dali_crop import HEAD_BYTES, HeaderSizes
    from fastdata.read.encoded import EncodedSource

    (tmp_path / "a").mkdir()
    Image.new("RGB", (90, 30)).save(tmp_path / "a" / "plain.jpg")
    Image.new("RGB", (70, 50)).save(tmp_path / "a" / "icc.jpg", icc_profile=bytes(100_000))
    source = EncodedSource(tmp_path)
    names = [source.name(i).rsplit("/", 1)[-1] for i in range(len(source))]
    reads = []
    full = source.get
    source.get = lambda i: reads.append(i) or full(i)
    h, w = HeaderSizes(source)(np.arange(len(source)))
    got = dict(zip(names, zip(h.tolist(), w.tolist())))
    assert got == {"plain.jpg": (30, 90), "icc.jpg": (50, 70)}
    assert [names[i] for i in reads] == ["icc.jpg"]
    assert (tmp_path / "a" / "icc.jpg").stat().st_size > HEAD_BYTES
