"""Every pixel mode a user's folder may hold becomes 8-bit RGB with its values kept (cache/codecs.py)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastdata.cache.codecs import open_rgb

GRAY = np.arange(0, 240, dtype=np.uint8).reshape(12, 20)       # 0..239: every level of a ramp


def _tiff(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="TIFF")
    return buf.getvalue()


@pytest.mark.parametrize("name,array", [
    ("float in 8-bit units", GRAY.astype(np.float32)),
    ("float in [0, 1]", GRAY.astype(np.float32) / 255.0),
    ("float in 16-bit units", GRAY.astype(np.float32) * 257.0),
    ("32-bit int in 8-bit units", GRAY.astype(np.int32)),
    ("32-bit int in 16-bit units", GRAY.astype(np.int32) * 257),
])
def test_wide_gray_images_keep_their_levels(name, array):
    img = Image.fromarray(array)
    assert img.mode in ("F", "I")
    got = np.asarray(open_rgb(_tiff(img)))
    assert got.shape == (12, 20, 3) and got.dtype == np.uint8
    assert np.abs(got[..., 0].astype(int) - GRAY).max() <= 1, name      # (truncation in 16-bit units)
    assert (got[..., 0] == got[..., 2]).all()


def test_ints_beyond_16_bits_are_scaled_by_the_images_own_top():
    arr = GRAY.astype(np.int32) * 2 ** 20
    arr[-1, -1] = 255 * 2 ** 20                    # the top level, in units of 2**20
    got = np.asarray(open_rgb(_tiff(Image.fromarray(arr))))[..., 0].astype(int)
    assert got[-1, -1] == 255 and np.abs(got - GRAY).ravel()[:-1].max() <= 1


def test_a_float_image_that_is_not_finite_or_is_flat_still_decodes():
    arr = GRAY.astype(np.float32) / 255.0
    arr[0, 0], arr[0, 1] = np.nan, np.inf
    got = np.asarray(open_rgb(_tiff(Image.fromarray(arr))))[..., 0].astype(int)
    assert got[0, 0] == got[0, 1] == 0 and np.abs(got - GRAY)[1:].max() <= 1     # the rest keeps its levels
    flat = np.asarray(open_rgb(_tiff(Image.fromarray(np.zeros((4, 4), np.float32)))))
    assert (flat == 0).all()


def test_alpha_is_composited_on_white_and_one_bit_images_are_black_and_white():
    rgba = np.zeros((4, 4, 4), np.uint8)
    rgba[..., 0], rgba[:2, :, 3] = 200, 255        # top half opaque red-ish, bottom half transparent
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, format="PNG")
    got = np.asarray(open_rgb(buf.getvalue()))
    assert (got[:2] == (200, 0, 0)).all() and (got[2:] == 255).all()
    buf = io.BytesIO()
    Image.fromarray(GRAY).convert("1").save(buf, format="PNG")
    assert set(np.unique(np.asarray(open_rgb(buf.getvalue())))) <= {0, 255}
