"""The NVJPG-engine decoder's CPU-side parts: which JPEGs it takes, its output table, its absence."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastdata.cache.jpeg_header import baseline_size, jpeg_frame
from fastdata.errors import LoaderError
from fastdata.read import hwjpeg
from fastdata.read.config import split_options
from fastdata.read.hw_decode import output_table, open_hardware_decoder


def _encode(mode: str, size=(40, 30), **kw) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 128 if mode == "L" else (10, 20, 30, 40)[:len(mode)]).save(buf, **kw)
    return buf.getvalue()


def test_only_baseline_8bit_colour_jpegs_go_to_the_engines():
    assert baseline_size(np.frombuffer(_encode("RGB", format="JPEG"), np.uint8)) == (30, 40)
    assert baseline_size(_encode("RGB", format="JPEG", subsampling=0)) == (30, 40)       # 4:4:4
    for other in (_encode("RGB", format="JPEG", progressive=True), _encode("L", format="JPEG"),
                  _encode("CMYK", format="JPEG"), _encode("RGB", format="PNG"), b"\xff\xd8\xff", b""):
        assert baseline_size(other) is None
    progressive = _encode("RGB", format="JPEG", progressive=True)
    assert jpeg_frame(progressive)[:2] == (30, 40)        # the frame is still read for other uses


def test_output_table_lays_planes_back_to_back_with_pitch_w():
    h, w = np.array([2, 3]), np.array([5, 4])
    table, offsets = output_table(1000, h, w)
    assert offsets.tolist() == [0, 30]                    # image 0 takes 3 planes of 2*5 bytes
    assert table[0, :4].tolist() == [1000, 1010, 1020, 0]
    assert table[1, :4].tolist() == [1030, 1042, 1054, 0]
    assert table[:, 4:7].tolist() == [[5, 5, 5], [4, 4, 4]] and (table[:, 7] == 0).all()
    assert table.dtype == np.uint64 and table.shape == (2, 8)    # nvjpegImage_t: 4 pointers, 4 size_t


def test_without_a_library_the_decoder_is_absent_with_the_reason(monkeypatch):
    import torch

    monkeypatch.setattr(hwjpeg, "_candidates", lambda: ["/nonexistent/libnvjpeg.so.99"])
    decoder, why = open_hardware_decoder(torch.device("cpu"))
    assert decoder is None and "no libnvjpeg" in why


def test_a_library_without_a_call_leaves_the_decoder_absent_with_the_reason(monkeypatch):
    import torch

    from fastdata.read import hw_decode

    class Call:                 # takes argtypes/restype like a ctypes function
        pass

    class OldLib:               # a libnvjpeg that predates (or dropped) the batched calls
        _name = "libnvjpeg.so.old"
        nvjpegCreateEx, nvjpegJpegStateCreate, nvjpegJpegStateDestroy, nvjpegDestroy = Call(), Call(), Call(), Call()

    monkeypatch.setattr(hw_decode, "load_nvjpeg", lambda: (OldLib(), OldLib._name))
    decoder, why = open_hardware_decoder(torch.device("cpu"))
    assert decoder is None and "nvjpegDecodeBatchedInitialize is missing from libnvjpeg.so.old" in why


def test_the_installed_libnvjpeg_has_every_call_we_declare():
    from fastdata.read.hw_decode import _declare

    lib, why = hwjpeg.load_nvjpeg()
    if lib is None:
        pytest.skip(why)
    _declare(lib)               # raises HardwareDecodeError naming a missing call
    assert lib.nvjpegDecodeBatched.argtypes is not None


def test_hardware_is_an_option_of_the_nvjpeg_backend_only():
    assert split_options("nvjpeg", {"hardware": True}).hardware is True
    assert split_options("nvjpeg", {}).hardware is False        # opt-in until measured on a GPU
    with pytest.raises(LoaderError, match="only backend nvjpeg takes it"):
        split_options("pil", {"hardware": False})
