"""The NVJPG engines (nvJPEG's hardware backend through hw_decode.py) on a real GPU: same pixels as
torchvision's decode, used by the loader where they open, and a batch they cannot take decoded
the torchvision way. Skipped where the engines are absent (the reason is printed)."""
from __future__ import annotations

import io
import shutil

import numpy as np
import pytest
import torch
from PIL import Image

import fastdata
from fastdata.read.augment import AugmentConfig
from fastdata.read.encoded import EncodedSource
from fastdata.cache.hw_decode import open_hardware_decoder

pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def engines():
    decoder, why = open_hardware_decoder(torch.device("cuda"))
    if decoder is None:
        pytest.skip(f"no NVJPG engines here: {why}")
    yield decoder
    decoder.close()


def test_engines_decode_what_torchvision_decodes(engines, jpeg_cache):
    from torchvision.io import ImageReadMode, decode_jpeg

    from fastdata.cache.jpeg_header import baseline_size

    encoded, _ = EncodedSource(jpeg_cache).get_batch(np.arange(24))
    hw = np.array([baseline_size(e) for e in encoded])
    stream = torch.cuda.Stream()
    batch = EncodedSource(jpeg_cache).get_spans(np.arange(24))
    assert np.array_equal(np.stack(batch.baseline_sizes(), 1), hw)
    for _ in range(3):          # both decode states, and one reused
        mine = engines.decode(*batch.pointers(), hw[:, 0], hw[:, 1], stream).images()
    stream.synchronize()
    ref = decode_jpeg([torch.from_numpy(e.copy()) for e in encoded], mode=ImageReadMode.RGB, device="cuda")
    diffs = [(a.float() - b.float()).abs().mean().item() for a, b in zip(mine, ref)]
    print(f"engines vs torchvision: mean abs diff {np.mean(diffs):.3f} levels, worst image {max(diffs):.3f}")
    assert all(a.shape == b.shape for a, b in zip(mine, ref))
    assert max(diffs) < 2.0


def test_loader_takes_the_engines_and_matches_the_torchvision_path(engines, jpeg_cache):
    outs, counts = [], []
    for hardware in (True, False):
        dl = fastdata.loader(jpeg_cache, 16, backend="nvjpeg", device="cuda", seed=5, hardware=hardware,
                             cpu_share=0, augment=AugmentConfig(size=48, dtype="float32"))
        outs.append([(b.images.float().cpu(), b.labels.cpu()) for b in dl])
        counts.append(dict(dl.backend.decoded))
        dl.close()
    assert counts[0]["hardware"] == len(EncodedSource(jpeg_cache)) and counts[0]["torchvision"] == 0
    assert counts[1]["hardware"] == 0
    for (a, la), (b, lb) in zip(*outs):
        assert torch.equal(la, lb) and (a - b).abs().mean() < 0.02


def test_a_batch_the_engines_cannot_take_is_decoded_by_torchvision(engines, image_folder, tmp_path):
    folder = tmp_path / "mixed"
    shutil.copytree(image_folder, folder)
    victim = sorted(folder.glob("*/*.jpg"))[0]
    img = Image.open(victim).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="JPEG", progressive=True, quality=90)
    victim.write_bytes(buf.getvalue())
    dl = fastdata.loader(folder, 8, backend="nvjpeg", device="cuda", shuffle=False, hardware=True,
                         augment=AugmentConfig(size=32, train=False))
    n = sum(len(b.labels) for b in dl)
    dl.close()
    # the progressive file's batch goes to torchvision and the engines take the others. The counts also
    # hold the batches the GPU thread decoded ahead, into the next epoch, before close() (an H100 run:
    # hardware 120 + torchvision 16 for n = 120), so they are bounds, not equalities
    done = dl.backend.decoded
    assert done["torchvision"] >= 8 and done["hardware"] >= n - 8 - 8 * dl.backend.stage_ahead
    assert n <= done["hardware"] + done["torchvision"] <= n + 8 * (dl.backend.stage_ahead + 1)


@pytest.mark.parametrize("hardware,share", [(True, 0.0), (False, 0.0), (True, None), (False, 0.5)])
def test_lanes_give_the_batches_of_one_lane_in_order(hardware, share, jpeg_cache):
    """Several GPU threads decode batches side by side; the loader still yields each epoch's batches in
    its order, with the same crops, and every sample once; also with the CPU's share (the default's, and
    half in 2 processes), whose page-locked slots are uploaded on the lanes' streams."""
    outs = []
    for lanes in (1, 3):
        dl = fastdata.loader(jpeg_cache, 8, backend="nvjpeg", device="cuda", seed=11, hardware=hardware,
                             lanes=lanes, cpu_share=share, cpu_processes=2 if share else None,
                             augment=AugmentConfig(size=40, dtype="float32"))
        outs.append([(b.images.float().cpu(), b.labels.cpu(), b.indices.numpy().copy()) for b in dl])
        dl.close()
    one, three = outs
    assert len(one) == len(three) and sorted(np.concatenate([i for *_, i in three]).tolist()) == \
        list(range(len(EncodedSource(jpeg_cache))))
    for (a, la, ia), (b, lb, ib) in zip(one, three):
        assert np.array_equal(ia, ib) and torch.equal(la, lb) and torch.equal(a, b)


def test_the_gpu_build_decodes_source_photos_on_the_engines(engines, image_folder):
    """build-cache --decoder nvjpeg's decode (gpu_engines.py) on real photos: every baseline file on the
    engines, the same pixels as torchvision's decode, one decoder per shard thread, freed at the end."""
    from torchvision.io import ImageReadMode, decode_jpeg

    from fastdata.cache import gpu_build
    from fastdata.cache.gpu_engines import EngineDecode

    datas = [p.read_bytes() for p in sorted(image_folder.rglob("*.jpg"))][:64]
    decode = EngineDecode(torch.device("cuda"), gpu_build._torchvision)
    mine = decode(datas)
    torch.cuda.synchronize()
    ref = decode_jpeg([torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas], mode=ImageReadMode.RGB,
                      device="cuda")
    diffs = [(a.float() - b.float()).abs().mean().item() for a, b in zip(mine, ref)]
    print(f"build decode on the engines: {decode.decoded}; against torchvision: mean abs diff "
          f"{np.mean(diffs):.3f} levels, worst image {max(diffs):.3f}")
    assert decode.decoded["hardware"] > len(datas) // 2, decode.decoded
    assert all(a.shape == b.shape for a, b in zip(mine, ref)) and max(diffs) < 2.0
    decode.close()


@pytest.mark.parametrize("hardware", [True, False])
def test_bytes_packed_into_pinned_slots_decode_as_bytes_read_in_place(hardware, jpeg_cache):
    """options.pinned: the ring of pinned slots (each reused once its batch was decoded, over three
    epochs of a small ring) yields the same batches as nvJPEG reading the cache's pages in place."""
    outs = []
    for pinned in (True, False):
        dl = fastdata.loader(jpeg_cache, 8, backend="nvjpeg", device="cuda", seed=3, hardware=hardware,
                             pinned=pinned, prefetch=1, cpu_share=0, augment=AugmentConfig(size=40, dtype="float32"))
        outs.append([(b.images.float().cpu(), b.labels.cpu()) for _ in range(3) for b in dl])
        dl.close()
    assert len(outs[0]) == len(outs[1]) == 3 * -(-len(EncodedSource(jpeg_cache)) // 8)
    for (a, la), (b, lb) in zip(*outs):
        assert torch.equal(la, lb) and torch.equal(a, b)


@pytest.mark.parametrize("hardware,pinned,share,decoder", [
    (True, False, 0.5, "torchvision"), (False, False, 0.5, "torchvision"), (True, True, 0.4, "torchvision"),
    (True, False, 1.0, "torchvision"), (True, False, 0.5, "pil"), (True, False, 0.5, "processes"),
    (False, True, 1.0, "processes")])
def test_a_cpu_share_of_each_batch_gives_the_gpus_batches_within_decoder_rounding(hardware, pinned, share, decoder,
                                                                                  jpeg_cache, monkeypatch):
    """options.cpu_share: the last images of each batch decoded on the CPU and joined to nvJPEG's give the
    same labels and crop windows as the GPU alone, pixels within the two decoders' rounding."""
    from fastdata.read.backends import cpu_share

    if decoder != "processes":      # (cpu_processes: PIL in forked processes, decode_pool.py)
        monkeypatch.setattr(cpu_share, "DECODER", decoder)
    outs, counts = [], []
    for part in (share, 0.0):
        procs = 2 if decoder == "processes" and part else 0
        dl = fastdata.loader(jpeg_cache, 8, backend="nvjpeg", device="cuda", seed=3, hardware=hardware,
                             pinned=pinned, cpu_share=part, cpu_processes=procs, prefetch=1,
                             augment=AugmentConfig(size=40, dtype="float32", mean=(0, 0, 0), std=(1, 1, 1)))
        outs.append([(b.images.float().cpu(), b.labels.cpu()) for _ in range(2) for b in dl])
        counts.append(dict(dl.backend.decoded))
        dl.close()
    assert counts[0]["cpu"] > 0 and counts[1]["cpu"] == 0
    for (a, la), (b, lb) in zip(*outs):
        assert torch.equal(la, lb) and a.shape == b.shape
        assert (a - b).abs().mean() * 255 < 2.0


def test_a_loader_never_closed_leaves_the_next_one_its_own_pixels(jpeg_cache):
    """Decode slots page-locked by the driver (host_pin.py): a loader dropped without close() unregisters
    its slots before they are unmapped, so the next loader's slots (often mapped at the same addresses)
    register and upload their own pixels. The first version gave the second loader the first one's
    pixels and left CUDA errors for torch's next launch (GPU suite, 2026-12-07)."""
    import gc

    def epoch(seed):
        dl = fastdata.loader(jpeg_cache, 8, backend="nvjpeg", device="cuda", seed=seed, cpu_share=1.0,
                             cpu_processes=2, prefetch=2, augment=AugmentConfig(size=40, dtype="float32"))
        out = [b.images.float().cpu() for b in dl]
        pinned = [s.pinned for s in dl.backend._slots]
        return out, pinned, dl

    first, pinned, dl = epoch(1)
    assert pinned and all(pinned), pinned
    del dl                       # never closed
    gc.collect()
    second, _, dl = epoch(2)
    again, _, dl2 = epoch(2)
    dl.close()
    dl2.close()
    assert torch.ones(4, device="cuda").sum().item() == 4      # no CUDA error left behind
    assert len(second) == len(again) and all(torch.equal(a, b) for a, b in zip(second, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, second))    # seed 2's crops, not seed 1's


def test_a_share_picked_by_default_is_steered_and_one_given_is_not(jpeg_cache, monkeypatch):
    """cpu_share=None on a host with decode processes: the backend reads a batch ahead per reader thread
    and steers the share (share_steer.py); waits reported by the loader move images to the GPU decoder.
    A share the user gives is not steered."""
    from fastdata.read.backends import decode_pool, nvjpeg

    monkeypatch.setattr(decode_pool, "usable_cpus", lambda: 8)      # 4 decode processes, whatever the host
    aug = AugmentConfig(size=40, dtype="float32")
    dl = fastdata.loader(jpeg_cache, 8, backend="nvjpeg", device="cuda", threads=6, augment=aug)
    given = fastdata.loader(jpeg_cache, 8, backend="nvjpeg", device="cuda", threads=3, augment=aug, cpu_share=1.0)
    try:
        me = dl.backend
        start = me._share
        assert me._steer is not None and start > 0 and given.backend._steer is None
        assert dl.cfg.read_ahead == 6        # a batch per reader thread (the default would be 4)
        me.waited = lambda s: nvjpeg.NvjpegBackend.waited(me, s + 1.0)   # every read late by a second
        seen = sum(len(b.labels) for _ in range(6) for b in dl)
        assert seen and me._share < start and me._steer.changes >= 1
        assert me.decoded["hardware"] + me.decoded["torchvision"] > 0 and me.decoded["cpu"] > 0
    finally:
        dl.close()
        given.close()
