"""The GPU build's decode on the NVJPG engines (cache/gpu_engines.py) on the CPU: the hardware decoder is
stood in for by one that reads the bytes at the pointers it is given and decodes them with PIL, so the
routing runs as on a GPU: which inputs go to the engines, order, fallback, one decoder per thread."""
from __future__ import annotations

import ctypes
import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from fastdata.cache import gpu_build
from fastdata.cache.gpu_engines import EngineDecode
from fastdata.cache.hw_decode import HardwareDecodeError, Planes

from test_gpu_build import _gpu_build, _jpeg, _pixels, messy_folder, pil_as_nvjpeg  # noqa: F401 (a fixture)

CPU = torch.device("cpu")


class FakeEngines:
    """hw_decode.HardwareJpegDecoder's call, decoding with PIL what lies at the given host addresses."""

    def __init__(self, refuse: bool = False) -> None:
        self.sent: list[int] = []
        self.refuse, self.closed = refuse, False

    def decode(self, pointers, lengths, heights, widths, stream):
        if self.refuse:
            raise HardwareDecodeError("nvjpegDecodeBatched returned 2: NVJPEG_STATUS_INVALID_PARAMETER")
        datas = [ctypes.string_at(int(p), int(n)) for p, n in zip(pointers, lengths)]
        images = pil_as_nvjpeg(datas)
        self.sent += [len(d) for d in datas]
        if [(im.shape[1], im.shape[2]) for im in images] != list(zip(heights.tolist(), widths.tolist())):
            raise RuntimeError("the sizes sent do not match the images")
        return Planes.of_images(images)

    def close(self) -> None:
        self.closed = True


def tolerant(datas) -> list[torch.Tensor]:
    """pil_as_nvjpeg per image, an empty tensor for one it cannot decode (not a batch error)."""
    out = []
    for d in datas:
        try:
            out.append(pil_as_nvjpeg([d])[0])
        except RuntimeError:
            out.append(torch.empty(0, dtype=torch.uint8))
    return out


def _progressive(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90, progressive=True)
    return buf.getvalue()


@pytest.fixture()
def inputs():
    rng = np.random.default_rng(0)
    arr = lambda h, w: rng.integers(0, 255, (h, w, 3), dtype=np.uint8)  # noqa: E731
    return {"baseline": _jpeg(arr(40, 64)), "turned": _jpeg(arr(30, 50), 6), "grey": _jpeg(arr(20, 24), mode="L"),
            "progressive": _progressive(arr(24, 40)), "truncated": _jpeg(arr(64, 64))[:-40],
            "baseline2": _jpeg(arr(48, 32))}


def test_baseline_colour_jpegs_go_to_the_engines_and_the_rest_to_the_fallback(inputs):
    engines, fell_back = FakeEngines(), []

    def fallback(datas):
        fell_back.extend(datas)
        return tolerant(datas)

    decode = EngineDecode(CPU, fallback, open_decoder=lambda _d: (engines, "stand-in"))
    names = list(inputs)
    got = decode([inputs[k] for k in names])
    assert sorted(engines.sent) == sorted(len(inputs[k]) for k in ("baseline", "turned", "baseline2"))
    assert sorted(len(d) for d in fell_back) == sorted(len(inputs[k]) for k in ("grey", "progressive", "truncated"))
    for k, x in zip(names, got):                   # in the batch's order, as stored (no EXIF turn)
        assert torch.equal(x, tolerant([inputs[k]])[0]), k
    assert decode.decoded == {"hardware": 3, "fallback": 3}


def test_a_batch_the_engines_refuse_is_decoded_by_the_fallback(inputs):
    decode = EngineDecode(CPU, pil_as_nvjpeg, open_decoder=lambda _d: (FakeEngines(refuse=True), "stand-in"))
    got = decode([inputs["baseline"], inputs["grey"], inputs["baseline2"]])
    assert [tuple(x.shape) for x in got] == [(3, 40, 64), (3, 20, 24), (3, 48, 32)]
    assert decode.decoded == {"hardware": 0, "fallback": 3}


def test_each_thread_opens_its_own_decoder_and_close_frees_them_all(inputs):
    opened: list[FakeEngines] = []

    def open_decoder(_device):
        opened.append(FakeEngines())
        return opened[-1], "stand-in"

    decode = EngineDecode(CPU, pil_as_nvjpeg, open_decoder=open_decoder)
    threads = [threading.Thread(target=lambda: [decode([inputs["baseline"]]) for _ in range(3)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 4 and decode.decoded["hardware"] == 12
    decode.close()
    assert all(e.closed for e in opened)


def test_without_engines_everything_goes_to_the_fallback(inputs):
    decode = EngineDecode(CPU, tolerant, open_decoder=lambda _d: (None, "no NVJPG engines here"))
    assert len(decode(list(inputs.values()))) == len(inputs) and decode.decoded["hardware"] == 0


def test_a_build_on_the_engines_matches_the_build_without_them(messy_folder, tmp_path, monkeypatch):
    """The same bytes as the torchvision-path build (both stand-ins decode with PIL), the same quarantine."""
    plain = _gpu_build(monkeypatch, messy_folder, tmp_path / "plain")
    engines = FakeEngines()
    monkeypatch.setattr(gpu_build, "engine_decode",
                        lambda: EngineDecode(CPU, gpu_build._torchvision, open_decoder=lambda _d: (engines, "")))
    on = _gpu_build(monkeypatch, messy_folder, tmp_path / "engines")
    assert len(engines.sent) > 10 and engines.closed
    assert [q["path"] for q in on.manifest.quarantined] == [q["path"] for q in plain.manifest.quarantined]
    (pk, pp), (ek, ep) = _pixels(tmp_path / "plain"), _pixels(tmp_path / "engines")
    assert pk == ek and np.array_equal(pp, ep)
