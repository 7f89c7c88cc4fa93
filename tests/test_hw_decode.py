"""The NVJPG-engine decoder's CPU-side parts: which JPEGs it takes, its output table, its absence."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastdata.cache.jpeg_header import baseline_size, jpeg_frame
from fastdata.errors import LoaderError
from fastdata.cache import hwjpeg
from fastdata.read.config import split_options
from fastdata.cache.hw_decode import output_table, open_hardware_decoder


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

    from fastdata.cache import hw_decode

    class Call:                 # takes argtypes/restype like a ctypes function
        pass

    class OldLib:               # a libnvjpeg that predates (or dropped) the batched calls
        _name = "libnvjpeg.so.old"
        nvjpegCreateEx, nvjpegJpegStateCreate, nvjpegJpegStateDestroy, nvjpegDestroy = Call(), Call(), Call(), Call()

    monkeypatch.setattr(hw_decode, "load_nvjpeg", lambda: (OldLib(), OldLib._name))
    decoder, why = open_hardware_decoder(torch.device("cpu"))
    assert decoder is None and "nvjpegDecodeBatchedInitialize is missing from libnvjpeg.so.old" in why


def test_the_installed_libnvjpeg_has_every_call_we_declare():
    from fastdata.cache.hw_decode import _declare

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


def _messy_jpegs() -> list[bytes]:
    """Baseline JPEGs of several shapes and writers' options, and everything the engines must not take."""
    exif = Image.Exif()
    exif[0x0112] = 6
    ok = [_encode("RGB", (w, h), format="JPEG", quality=q, subsampling=sub, optimize=opt)
          for (w, h), q, sub, opt in [((40, 30), 75, 2, False), ((257, 31), 95, 0, True), ((8, 700), 20, 1, False)]]
    ok.append(_encode("RGB", (33, 17), format="JPEG", exif=exif.tobytes()))
    ok.append(_encode("RGB", (64, 48), format="JPEG", comment=b"x" * 60000))       # a long COM segment
    fill = bytearray(ok[0])
    fill[2:2] = b"\xff"                  # a fill byte before the first marker: jpeg_scan's slow path
    junk = np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes()
    return ok + [bytes(fill), _encode("RGB", format="JPEG", progressive=True), _encode("L", format="JPEG"),
                 _encode("CMYK", format="JPEG"), _encode("RGB", format="PNG"), ok[1][:60], b"\xff\xd8\xff", b"",
                 junk, b"\xff\xd8" + junk]


@pytest.mark.parametrize("max_segments", [24, 2])
def test_the_batch_header_walk_finds_what_baseline_size_finds(max_segments):
    """baseline_sizes (numpy, a batch at once) against baseline_size per image, on every kind of input;
    max_segments=2 sends most images to the per-image fallback."""
    from fastdata.cache.jpeg_header import baseline_sizes

    jpegs = _messy_jpegs()
    data = np.frombuffer(b"".join(jpegs), np.uint8)
    ends = np.cumsum([len(j) for j in jpegs])
    got = baseline_sizes(data, ends - [len(j) for j in jpegs], ends, max_segments=max_segments)
    want = [baseline_size(np.frombuffer(j, np.uint8)) or (-1, -1) for j in jpegs]
    assert [tuple(r) for r in got.tolist()] == want
    assert sum(w != (-1, -1) for w in want) == 6       # the six baseline colour ones (fill byte included)


def test_a_cache_batch_as_spans_is_the_batch_as_arrays(jpeg_cache):
    """get_spans: the same bytes and labels as get_batch, pointers at those bytes, and the sizes the
    engines get; one odd image sends the whole batch to torchvision (no sizes)."""
    from fastdata.read.encoded import EncodedSource
    from fastdata.read.spans import EncodedBatch

    src = EncodedSource(jpeg_cache)
    idx = np.array([0, 5, len(src) - 1, 7, 3])
    arrays, labels = src.get_batch(idx)
    batch = src.get_spans(idx)
    assert len(batch.buffers) > 1 and np.array_equal(batch.labels, labels)
    assert all(np.array_equal(a, b) for a, b in zip(batch.arrays(), arrays))
    ptrs, lengths = batch.pointers()
    assert lengths.tolist() == [a.nbytes for a in arrays]
    assert ptrs.tolist() == [a.__array_interface__["data"][0] for a in arrays]
    h, w = batch.baseline_sizes()
    assert list(zip(h.tolist(), w.tolist())) == [baseline_size(a) for a in arrays]
    odd = EncodedBatch.of_arrays(arrays[:2] + [np.frombuffer(_encode("L", format="JPEG"), np.uint8)], [0, 0, 0])
    assert odd.baseline_sizes() is None and len(odd) == 3


def test_a_caches_sizes_are_walked_once_a_shard_and_match_the_walk_per_batch(jpeg_cache, monkeypatch):
    """get_spans(sizes=True): sizes from one header walk of each shard (walked per batch, the headers
    cost the reader threads the GIL a fast model's launches needed), equal to the batch's own walk;
    a batch slice and a packed batch keep them."""
    from fastdata.read import encoded, sample_index
    from fastdata.read.encoded import EncodedSource

    walks = []
    real = encoded.baseline_sizes
    for module in (encoded, sample_index):     # (sample_index.py for a local cache, encoded.py's walk otherwise)
        monkeypatch.setattr(module, "baseline_sizes", lambda *a, **kw: walks.append(len(a[1])) or real(*a, **kw))
    src = EncodedSource(jpeg_cache)
    idx = np.array([len(src) - 1, 0, 5, 3, 1])
    for _ in range(3):
        batch = src.get_spans(idx, sizes=True)
    assert sorted(walks) == sorted(src.shard_counts[s] for s in {src.cache.locate(int(i))[0] for i in idx})
    known = batch.baseline_sizes()
    walked = src.get_spans(idx).baseline_sizes()
    assert src.get_spans(idx).sizes is None
    assert [x.tolist() for x in known] == [x.tolist() for x in walked]
    assert [x.tolist() for x in batch.take(1, 4).baseline_sizes()] == [x[1:4].tolist() for x in walked]
    packed = batch.packed(np.empty(batch.nbytes(), np.uint8))
    assert [x.tolist() for x in packed.baseline_sizes()] == [x.tolist() for x in walked]


def test_a_batch_packed_into_one_room_keeps_every_sample_and_label(jpeg_cache):
    """packed(): the spans of several shards copied back to back into one buffer (the pinned slot the
    nvjpeg backend hands to nvJPEG): same bytes, labels and sizes, pointers inside the room."""
    from fastdata.read.encoded import EncodedSource

    src = EncodedSource(jpeg_cache)
    batch = src.get_spans(np.array([len(src) - 1, 0, 5, 3]))
    room = np.full(batch.nbytes() + 7, 0xAB, np.uint8)
    packed = batch.packed(room)
    assert len(packed.buffers) == 1 and np.array_equal(packed.labels, batch.labels)
    assert all(np.array_equal(a, b) for a, b in zip(packed.arrays(), batch.arrays()))
    ptrs, lengths = packed.pointers()
    assert ptrs[0] == room.ctypes.data and np.array_equal(np.diff(ptrs), lengths[:-1])
    assert (room[batch.nbytes():] == 0xAB).all()        # nothing written past the batch
    assert [x.tolist() for x in packed.baseline_sizes()] == [x.tolist() for x in batch.baseline_sizes()]


def test_a_pinned_slot_is_refilled_only_after_its_last_decode_and_grows_to_fit(jpeg_cache, monkeypatch):
    """NvjpegBackend._reuse waits for the event of the batch decoded from the slot before and skips a
    failed one (finish() raised it); _pack gives the slot a larger room when a batch needs more."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    import torch

    from fastdata.read.backends.nvjpeg import NvjpegBackend
    from fastdata.read.encoded import EncodedSource

    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **kw: empty(*a, **kw))  # no CUDA here
    waited = []
    done, failed = Future(), Future()
    done.set_result((None, None, SimpleNamespace(synchronize=lambda: waited.append(1))))
    failed.set_exception(RuntimeError("decode failed"))
    src = EncodedSource(jpeg_cache)
    slot = {"room": None, "staged": None}
    small = NvjpegBackend._pack(None, src.get_spans(np.arange(2)), slot)
    first = slot["room"]
    slot["staged"] = done
    NvjpegBackend._reuse(slot)
    big = NvjpegBackend._pack(None, src.get_spans(np.arange(8)), slot)
    assert waited == [1] and slot.get("staged") is None and slot["room"] is not first
    assert slot["room"].numel() >= big.nbytes() > small.nbytes()
    slot["staged"] = failed
    NvjpegBackend._reuse(slot)
    again = NvjpegBackend._pack(None, src.get_spans(np.arange(3)), slot)
    assert waited == [1] and again.buffers[0].ctypes.data == slot["room"].data_ptr()
