"""One shared check for every resumable stage: save mid-epoch, restore into a fresh one, compare."""
from __future__ import annotations

import io
import signal

import numpy as np

import torch

from fastdata.cache.build import BuildConfig, build_cache
from fastdata.cache.codecs import CodecConfig, decode
from fastdata.read.augment import AugmentConfig, normalize


def terminal_signals() -> None:
    """Popen preexec_fn: the child's Ctrl-C as in a terminal. A shell script's background job (`pytest ... &`)
    starts with SIGINT ignored and its children inherit that, so a CLI rightly ignores the test's Ctrl-C (the
    build ran to the end, exit 0, in a suite started that way)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def build(src, dest, **kw):
    """build_cache with small test defaults (64 px, 1 MB shards, no progress bar)."""
    kw.setdefault("progress", False)
    kw.setdefault("size", 64)
    kw.setdefault("shard_size", "1MB")
    return build_cache(BuildConfig(src=str(src), dest=str(dest), **kw))


def pil_reference(image_folder, size: int = 64) -> tuple[torch.Tensor, list[int]]:
    """Every image of the folder, in discovery order, decoded by PIL at full resolution (no draft
    mode) and resized to size x size, normalised NCHW: what an eval-mode loader should return."""
    from fastdata.cache.sources import discover

    items = discover(image_folder).items
    pix = np.stack([np.asarray(decode(open(it.path, "rb").read(), CodecConfig(size=size, draft=False)))
                    for it in items])
    ref = normalize(torch.from_numpy(pix), AugmentConfig(size=size, channels_last=False))
    return ref, [it.label for it in items]


def epoch_indices(loader) -> list[np.ndarray]:
    return [b.indices.numpy().copy() for b in loader]


def check_resume(make_loader, stop_after: int) -> None:
    """make_loader() -> fresh loader. After a stop at batch `stop_after` and a restore, the rest of the
    epoch equals the uninterrupted run's rest, and the two parts together cover the epoch once."""
    full = epoch_indices(make_loader())
    first = make_loader()
    seen = []
    for k, b in enumerate(first):
        seen.append(b.indices.numpy().copy())
        if k + 1 == stop_after:
            break
    state = first.state_dict()
    second = make_loader()
    second.load_state_dict(state)
    rest = epoch_indices(second)
    assert [a.tolist() for a in seen + rest] == [a.tolist() for a in full]
    joined = np.concatenate(seen + rest)
    assert len(np.unique(joined)) == len(joined), "a sample was yielded twice"
    cov = second.coverage()
    assert cov["repeated"] == 0 and cov["seen"] == len(joined)


def _epochs(dl, n: int) -> list[list]:
    """n passes: per epoch, the batches' (indices, image checksum)."""
    return [[(b.indices.tolist(), float(b.images.float().sum())) for b in dl] for _ in range(n)]


def _consume(dl, stop: int) -> list:
    """Take `stop` batches across passes (a pass runs to its end before the next begins), then stop."""
    got = []
    while len(got) < stop:
        for b in dl:
            got.append((b.indices.tolist(), float(b.images.float().sum())))
            if len(got) == stop:
                break
    return got


def check_resume_contract(make, name: str) -> None:
    """make(rank, world) -> fresh loader. A state saved at the start, mid-epoch, mid-way through the
    second epoch and at an epoch's end restores into a fresh loader that yields exactly the batches
    (samples and pixels) the uninterrupted run yields from there; the rank split is disjoint and complete."""
    ref = _epochs(make(0, 1), 2)
    n = len(ref[0])
    flat = ref[0] + ref[1]
    for stop in (0, n // 2, n, n + n // 2):
        first = make(0, 1)
        seen = _consume(first, stop)
        second = make(0, 1)
        second.load_state_dict(first.state_dict())
        rest = [(b.indices.tolist(), float(b.images.float().sum())) for b in second]
        if stop % n == 0 and stop:          # saved at an epoch's end: the next pass is the next epoch
            assert rest == ref[1], f"{name}: resume at the end of epoch 0"
            continue
        epoch_end = n if stop < n else 2 * n
        assert seen == flat[:stop], f"{name}: the run before the stop"
        assert [r[0] for r in rest] == [f[0] for f in flat[stop:epoch_end]], f"{name}: samples after stop {stop}"
        assert np.allclose([r[1] for r in rest], [f[1] for f in flat[stop:epoch_end]], rtol=1e-4), \
            f"{name}: pixels after stop {stop}"
        cov = second.coverage()
        assert cov["repeated"] == 0 and cov["missed"] == 0, f"{name}: coverage after stop {stop}"
    total = len(make(0, 1).coverage_audit.counts)
    parts = [np.concatenate([b.indices.numpy() for b in make(r, 2)]) for r in range(2)]
    joined = np.concatenate(parts)
    assert len(np.unique(joined)) == len(joined) == total - total % 2, f"{name}: rank split"


def kill_build_after(cmd: list[str], dest, shards_done: int, extra_s: float) -> bool:
    """Run CMD (`python -m fastdata.cli build-cache ...`) so that it kills -9 itself and its workers
    once its journal records `shards_done` shards and `extra_s` more seconds have passed (see
    tests/killed_build.py: the kill comes from inside, so machine load cannot make it miss).
    True if the build was left unfinished."""
    import subprocess
    import sys
    from pathlib import Path

    if cmd[1:3] != ["-m", "fastdata.cli"]:
        raise ValueError(f"expected a `python -m fastdata.cli` command, got {cmd[:3]}")
    script = Path(__file__).with_name("killed_build.py")
    full = [sys.executable, str(script), str(shards_done), str(extra_s), "--", *cmd[3:]]
    proc = subprocess.Popen(full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    if proc.wait(timeout=300) == 0:
        return False
    return not (dest / "manifest.json").exists()


def flaky_build_shard(task):
    """build_shard that dies once per shard (a lost worker), for the Dask retry test. Marker files
    in $FASTDATA_TEST_FLAKY_DIR remember which shards already failed, across worker processes."""
    import os
    from pathlib import Path

    from fastdata.cache.jobs import build_shard

    marker = Path(os.environ["FASTDATA_TEST_FLAKY_DIR"]) / f"failed-{task[0]}"
    if not marker.exists():
        marker.write_text("x")
        raise RuntimeError(f"injected worker failure on shard {task[0]}")
    return build_shard(task)


def noise_folder(root, classes=("a", "b"), per_class: int = 3, hw=(40, 48), ext: str = "jpg", seed: int = 0):
    """An ImageFolder of random-noise images of one size (for tests about sizes and formats, not pixels)."""
    from pathlib import Path

    from PIL import Image

    rng = np.random.default_rng(seed)
    root = Path(root)
    for cls in classes:
        (root / cls).mkdir(parents=True, exist_ok=True)
        for k in range(per_class):
            Image.fromarray(rng.integers(0, 255, (*hw, 3), dtype=np.uint8)).save(root / cls / f"{k}.{ext}")
    return root


def exif_photos(root, orientations=(1, 6, 3, 8)):
    """An ImageFolder (one class) of the same picture (ramps and a checkerboard) saved with each EXIF
    orientation, as phone cameras store photos taken sideways."""
    import io
    from pathlib import Path

    from PIL import Image

    yy, xx = np.mgrid[0:48, 0:80]
    arr = np.stack([xx * 3, yy * 5, (xx // 8 + yy // 8) % 2 * 255], -1).astype(np.uint8)
    folder = Path(root) / "a"
    folder.mkdir(parents=True, exist_ok=True)
    for k, o in enumerate(orientations):
        exif = Image.Exif()
        exif[0x0112] = o
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, "JPEG", quality=95, exif=exif.tobytes())
        (folder / f"{k}.jpg").write_bytes(buf.getvalue())
    return Path(root)


def random_jpeg(w: int, h: int, seed: int, mode: str = "RGB") -> np.ndarray:
    """The bytes of a w x h JPEG of noise (quality 90), as a uint8 array, as a JPEG cache holds them."""
    from PIL import Image

    px = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(px).convert(mode).save(buf, format="JPEG", quality=90)
    return np.frombuffer(buf.getvalue(), np.uint8)


def spans_batch(jpegs):
    """The images (uint8 arrays) as spans of one shard-like buffer, as a JPEG cache's batch is."""
    from fastdata.read.spans import EncodedBatch

    buf = np.concatenate(jpegs)
    ends = np.cumsum([j.nbytes for j in jpegs])
    return EncodedBatch((buf,), np.zeros(len(jpegs), np.int64), ends - [j.nbytes for j in jpegs], ends,
                        np.arange(len(jpegs), dtype=np.int64))


def planar_rgb(data) -> np.ndarray:
    """A JPEG's pixels decoded by PIL as planar RGB, flat: what the decode processes write into a slot."""
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(bytes(data))).convert("RGB")).transpose(2, 0, 1).reshape(-1)
