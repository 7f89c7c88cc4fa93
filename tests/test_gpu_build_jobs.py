"""build-cache --decoder nvjpeg's shard jobs on the CPU (nvJPEG stood in for by PIL, as in test_gpu_build.py):
the next batch's files read during a decode, and inputs routed to the CPU codec to be quarantined."""
from __future__ import annotations

import numpy as np
from PIL import Image

from fastdata.cache import gpu_build
from fastdata.cache.codecs import CodecConfig, oversized
from fastdata.cache.verify import verify_cache

from helpers import build
from test_gpu_build import _gpu_build, pil_as_nvjpeg


def test_the_next_batch_is_read_while_this_one_decodes(image_folder, tmp_path, monkeypatch):
    """A shard's reads of batch k+1 are under way before batch k's decode returns: the stand-in decoder of
    the first batch waits until a file of the second has been read, which fails without the read-ahead."""
    import threading

    read_second, first, real_read = threading.Event(), [], gpu_build._read

    def read(item, options):
        if first and item.path not in first[0]:
            read_second.set()
        return real_read(item, options)

    def decode(datas):
        if len(first) == 1:
            first.append(read_second.wait(60))
        return pil_as_nvjpeg(datas)

    items = sorted(p for p in image_folder.rglob("*.jpg"))[:40]
    first.append({str(p) for p in items[:16]})      # BATCH is 16 in _gpu_build
    monkeypatch.setattr(gpu_build, "_read", read)
    lst = tmp_path / "list.csv"
    lst.write_text("".join(f"{p},{p.parent.name}\n" for p in items))
    _gpu_build(monkeypatch, lst, tmp_path / "gpu", decode=decode)
    assert first[1] is True, "batch 1's files were not read before batch 0's decode returned"
    assert verify_cache(tmp_path / "gpu").ok


def test_an_image_too_narrow_for_resize_short_is_quarantined_by_both_decoders(tmp_path, monkeypatch):
    """--resize short scales a 1 x 60,000 strip to 256 x 15,360,000 (past 89.5 megapixels): quarantined with
    the sizes and the fix named (a 1 x 20,000 strip took a build 14 GB and 72 s), by the CPU codec and by
    the GPU build's routing to it; --resize fixed builds it."""
    src = tmp_path / "src"
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (64, 80, 3), dtype=np.uint8)).save(src / "a" / "ok.jpg")
    Image.fromarray(rng.integers(0, 255, (1, 60_000, 3), dtype=np.uint8)).save(src / "b" / "strip.jpg")
    cpu = build(src, tmp_path / "cpu", resize="short", size=256, workers=0)
    gpu = _gpu_build(monkeypatch, src, tmp_path / "gpu", resize="short", size=256)
    for cache in (cpu, gpu):
        (q,) = cache.manifest.quarantined
        assert q["path"].endswith("strip.jpg") and "60000x1 px would be resized to 15360000x256" in q["reason"]
        assert "--resize fixed or max" in q["reason"] and sum(s.count for s in cache.manifest.shards) == 1
    fixed = build(src, tmp_path / "fixed", resize="fixed", size=64, workers=0)
    assert sum(s.count for s in fixed.manifest.shards) == 2 and not fixed.manifest.quarantined


def test_ordinary_photos_pass_the_size_limit_at_the_largest_size():
    """At --size 16384, --resize short makes a 4:3 photo 16384 x 21845 (358 megapixels, past PIL's 89.5):
    that is a large size, not a narrow image, so it builds; a 5:1 strip at the same size is still refused."""
    cfg = CodecConfig(resize="short", size=16384)
    assert oversized(4000, 3000, cfg) is None and oversized(4000, 1000, cfg) is None
    assert "narrow" in oversized(5000, 1000, cfg)
    assert oversized(60_000, 1, CodecConfig(resize="short", size=256)) is not None
