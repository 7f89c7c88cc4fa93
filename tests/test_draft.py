"""Reduced-scale JPEG decode (PIL draft, libjpeg DCT scaling) is the build's default only within a tolerance.

Tolerance, against full decode + the same resize, on real photos at sizes where draft applies
(a source at least twice the target): mean absolute difference <= 2.5 levels of 255, and PSNR >= 34 dB.
Measured (benchmarks/draft.py, results/draft-cpu2-*.md): 1.4-1.8 levels, 36.6-39.4 dB, 1.7-2.1x faster.
"""
from __future__ import annotations

import numpy as np
import pytest

from fastdata.cache.build import BuildConfig
from fastdata.cache.codecs import CodecConfig, decode

MEAN_LEVELS, MIN_PSNR = 2.5, 34.0


@pytest.mark.parametrize("size", [64, 128])
def test_draft_decode_stays_within_the_stated_tolerance(image_folder, size):
    files = sorted(image_folder.rglob("*.jpg"))[::4]
    diffs = []
    for p in files:
        data = p.read_bytes()
        full = np.asarray(decode(data, CodecConfig(size=size, draft=False)), dtype=np.float64)
        fast = np.asarray(decode(data, CodecConfig(size=size, draft=True)), dtype=np.float64)
        assert full.shape == fast.shape
        diffs.append(np.abs(full - fast).ravel())
    d = np.concatenate(diffs)
    psnr = 10 * np.log10(255 ** 2 / np.mean(d ** 2))
    assert d.mean() <= MEAN_LEVELS and psnr >= MIN_PSNR, (d.mean(), psnr)
    assert d.mean() > 0   # draft really changed the decode (the comparison is not vacuous)


def test_draft_is_the_build_default():
    assert BuildConfig(src="a", dest="b").codec().draft is True
