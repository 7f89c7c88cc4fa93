"""Shared fixtures: a small photo-like ImageFolder from skimage/sklearn photos, and caches of it."""
from __future__ import annotations

import numpy as np
import pytest

from helpers import build
from fastdata.sample import base_photos, make_image_folder


@pytest.fixture(scope="session")
def photos() -> dict[str, np.ndarray]:
    return base_photos()


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory):
    """10 classes x 12 JPEGs of ~500x375, from real photos."""
    return make_image_folder(tmp_path_factory.mktemp("src") / "images", per_class=12, workers=2)


@pytest.fixture(scope="session")
def raw_cache(image_folder, tmp_path_factory):
    dest = tmp_path_factory.mktemp("raw") / "cache"
    build(image_folder, dest, workers=2)
    return dest


@pytest.fixture(scope="session")
def pt_cache(image_folder, tmp_path_factory):
    dest = tmp_path_factory.mktemp("pt") / "cache"
    build(image_folder, dest, format="pt", workers=2)
    return dest


@pytest.fixture(scope="session")
def jpeg_cache(image_folder, tmp_path_factory):
    dest = tmp_path_factory.mktemp("jpeg") / "cache"
    build(image_folder, dest, encode="jpeg", quality=95, shard_size="200KB", workers=2)
    return dest


@pytest.fixture(scope="session")
def variable_cache(image_folder, tmp_path_factory):
    """A raw cache of images of different sizes (--resize short: aspect kept)."""
    dest = tmp_path_factory.mktemp("var") / "cache"
    build(image_folder, dest, resize="short", size=48, workers=2, shard_size="300KB")
    return dest


@pytest.fixture(scope="module")
def pool():
    """Two forked decode processes (read/backends/decode_pool.py), shared by a test module."""
    from fastdata.read.backends.decode_pool import DecodePool

    p = DecodePool(2)
    yield p
    p.close()
