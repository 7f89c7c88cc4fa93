"""Write side: round trip, resume after kill -9, corrupt inputs, checksums, locking, parts, staging."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastdata.cache.codecs import CodecConfig, decode
from fastdata.cache.format import FORMAT_VERSION, load_manifest
from fastdata.cache.merge import merge_caches
from fastdata.cache.stage import stage_cache, unstage
from fastdata.cache.verify import verify_cache
from fastdata.read.dataset import CacheDataset
from fastdata.errors import BuildError, CacheFormatError, FastdataError, SourceError
from fastdata.sample import make_corrupt_zoo

from helpers import build, kill_build_after


def _direct(path: Path, size: int) -> np.ndarray:
    return np.asarray(decode(path.read_bytes(), CodecConfig(size=size)))


@pytest.mark.parametrize("cache_name", ["raw_cache", "pt_cache"])
def test_round_trip_equals_direct_decode(cache_name, request, image_folder):
    cache = request.getfixturevalue(cache_name)
    m = load_manifest(cache)
    ds = CacheDataset(cache)
    files = sorted(p for p in image_folder.rglob("*.jpg"))
    assert m.num_samples == len(files) == len(ds)
    assert m.format_version == FORMAT_VERSION and m.sample_shape == (64, 64, 3)
    assert list(m.label_map) == sorted(d.name for d in image_folder.iterdir())
    for i in (0, 7, len(ds) - 1):
        img, label = ds[i]
        key = ds.cache.shard(ds.cache.locate(i)[0]).keys[ds.cache.locate(i)[1]]
        assert np.array_equal(img.numpy(), _direct(image_folder / key, 64))
        assert label == m.label_map[key.split("/")[0]]


def test_jpeg_cache_decodes_close_to_raw(raw_cache, jpeg_cache):
    raw, jpg = CacheDataset(raw_cache), CacheDataset(jpeg_cache)
    assert load_manifest(jpeg_cache).kind == "jpeg" and len(load_manifest(jpeg_cache).shards) > 1
    for i in (0, 50, len(raw) - 1):
        a, b = raw[i][0].float(), jpg[i][0].float()
        assert a.shape == b.shape and (a - b).abs().mean() < 4.0  # quality-95 re-encode
        assert raw[i][1] == jpg[i][1]


def test_both_formats_hold_identical_samples(raw_cache, pt_cache):
    a, b = CacheDataset(raw_cache), CacheDataset(pt_cache)
    for i in range(0, len(a), 17):
        assert np.array_equal(a[i][0].numpy(), b[i][0].numpy()) and a[i][1] == b[i][1]


def test_rebuild_same_dest_is_a_no_op_and_other_settings_are_refused(image_folder, tmp_path):
    dest = tmp_path / "c"
    first = build(image_folder, dest, workers=0)
    again = build(image_folder, dest, workers=0)
    assert again.written == 0 and again.manifest == first.manifest
    with pytest.raises(BuildError, match="other settings"):
        build(image_folder, dest, size=32)


def _shard_hashes(dest: Path) -> dict[str, str]:
    m = load_manifest(dest)
    return {s.name: s.sha256 for s in m.shards}


def test_resume_after_kill_is_byte_identical(image_folder, tmp_path):
    clean = tmp_path / "clean"
    t0 = time.perf_counter()
    build(image_folder, clean, workers=2, shard_size="60KB", size=96)
    seconds = time.perf_counter() - t0  # kill delays scale with this machine's build speed
    dest = tmp_path / "killed"
    cmd = [sys.executable, "-m", "fastdata.cli", "build-cache", str(image_folder), str(dest), "--size", "96",
           "--shard-size", "60KB", "--workers", "2", "--no-progress"]
    rng = np.random.default_rng(1)
    interrupted = 0
    for delay in (*rng.uniform(0.0, 0.4 * seconds, size=2), 0.0):  # the last lands right after shard 1
        interrupted += kill_build_after(cmd, dest, 1, float(delay))
    assert interrupted == 3, "a kill did not land mid-build: the test did not test resume"
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert _shard_hashes(dest) == _shard_hashes(clean)
    assert load_manifest(dest).to_json()["shards"] == load_manifest(clean).to_json()["shards"]
    assert not list(dest.glob("*.tmp"))


def test_corrupt_zoo_is_quarantined_and_good_files_kept(photos, tmp_path):
    src = tmp_path / "src"
    expect = make_corrupt_zoo(src, photos["chelsea"])
    good = Image.fromarray(photos["coffee"])
    (src / "good").mkdir()
    for i in range(3):
        good.save(src / "good" / f"g{i}.jpg", quality=90)
    result = build(src, tmp_path / "c", workers=2)
    m = result.manifest
    bad = {q["path"] for q in m.quarantined}
    assert bad == {k for k, v in expect.items() if v == "bad"}
    assert all(q["reason"] for q in m.quarantined)
    ds = CacheDataset(tmp_path / "c")
    keys = {ds.cache.shard(s).keys[j] for s in range(ds.cache.num_shards) for j in range(len(ds.cache.shard(s)))}
    assert keys == {k for k, v in expect.items() if v == "ok"} | {f"good/g{i}.jpg" for i in range(3)}
    # EXIF orientation 6 applied: a landscape photo becomes portrait before the centre crop
    rot = decode((src / "zoo/exif_rotated.jpg").read_bytes(), CodecConfig(size=64, resize="short"))
    assert rot.height > rot.width
    gray16 = np.asarray(decode((src / "zoo/gray16.png").read_bytes(), CodecConfig(size=64)))
    assert 20 < gray16.mean() < 235  # scaled from 16 bit, not clipped to white


def test_on_error_raise_names_the_file_and_keeps_finished_shards(photos, tmp_path):
    src = tmp_path / "src"
    expect = make_corrupt_zoo(src, photos["chelsea"])
    bad = "|".join(k.split("/")[-1].replace(".", r"\.") for k, v in expect.items() if v == "bad")
    with pytest.raises(BuildError, match=rf"zoo/({bad}): .*--on-error quarantine"):
        build(src, tmp_path / "c", on_error="raise", workers=0)
    assert not (tmp_path / "c" / "manifest.json").exists()


def test_verify_names_damaged_shard_and_sample(image_folder, tmp_path):
    dest = tmp_path / "c"
    build(image_folder, dest, workers=0)
    assert verify_cache(dest).ok
    m = load_manifest(dest)
    target = dest / m.shards[1].name
    from fastdata.cache.shardfile import open_shard

    shard = open_shard(target)
    # flip one byte inside sample 3's pixels, located through the h5 data offset
    import h5py

    with h5py.File(target, "r") as f:
        base = f["data"].id.get_offset()
    pos = base + int(shard.offsets[3]) + 5
    raw = bytearray(target.read_bytes())
    raw[pos] ^= 0xFF
    target.write_bytes(bytes(raw))
    report = verify_cache(dest)
    assert not report.ok and list(report.damaged) == [m.shards[1].name]
    assert [i for i, _ in report.samples[m.shards[1].name]] == [m.shards[0].count + 3]
    assert m.shards[1].name in report.text()


def test_truncated_shard_and_newer_manifest_give_clear_errors(image_folder, tmp_path):
    dest = tmp_path / "c"
    build(image_folder, dest, workers=0)
    m = load_manifest(dest)
    p = dest / m.shards[0].name
    p.write_bytes(p.read_bytes()[:1000])
    ds = CacheDataset(dest)
    with pytest.raises(CacheFormatError, match=m.shards[0].name):
        ds[0]
    d = json.loads((dest / "manifest.json").read_text())
    d["format_version"] = FORMAT_VERSION + 1
    (dest / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(CacheFormatError, match="newer than this fastdata"):
        load_manifest(dest)


def test_concurrent_build_is_refused(image_folder, tmp_path):
    dest = tmp_path / "c"
    dest.mkdir()
    code = f"from fastdata.cache.journal import BuildLock\nimport pathlib,time\n" \
           f"with BuildLock(pathlib.Path({str(dest)!r})):\n    print('held', flush=True); time.sleep(30)\n"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BuildError, match="another build is writing here"):
            build(image_folder, dest, workers=0)
    finally:
        holder.kill()
        holder.wait()
    assert build(image_folder, dest, workers=0).manifest.num_samples > 0  # lock freed by the kernel


def test_parts_merge_to_the_full_build(image_folder, tmp_path):
    parts = [build(image_folder, tmp_path / f"p{i}", part=(i, 3), workers=0) for i in range(3)]
    assert sum(p.manifest.num_samples for p in parts) == 120
    merged = merge_caches(tmp_path / "all", [tmp_path / f"p{i}" for i in range(3)])
    build(image_folder, tmp_path / "full", workers=0)
    full = CacheDataset(tmp_path / "full")
    got = CacheDataset(tmp_path / "all")
    assert merged.num_samples == len(full) == len(got)
    assert all(np.array_equal(full[i][0].numpy(), got[i][0].numpy()) for i in range(0, 120, 11))


def test_stage_copies_and_falls_back(raw_cache, tmp_path, monkeypatch, caplog):
    target = tmp_path / "shm" / "c"
    assert stage_cache(raw_cache, target) == target
    assert verify_cache(target).ok
    unstage(target)
    assert not target.exists()
    import fastdata.cache.stage as stage

    monkeypatch.setattr(stage.shutil, "disk_usage", lambda p: type("U", (), {"free": 10})())
    assert stage_cache(raw_cache, target) == raw_cache
    assert "not staging" in caplog.text


def test_unstage_leaves_a_file_someone_else_put_in_the_staged_copy(raw_cache, tmp_path, capsys):
    """`stage --remove` deleted the whole folder (rmtree), a user's file in it too; now only what staging
    wrote goes, the user's file stays and is named, and a re-stage over it is refused before copying."""
    from fastdata.cli import main

    target = tmp_path / "shm" / "c"
    assert stage_cache(raw_cache, target) == target
    (target / "notes.txt").write_text("mine")
    (target / "runs").mkdir()
    assert main(["stage", "--remove", str(target)]) == 0
    assert "left the 2 file(s) fastdata did not put there: notes.txt, runs" in capsys.readouterr().out
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt", "runs"]
    with pytest.raises(FastdataError, match="exists and was not staged"):
        stage_cache(raw_cache, target)               # (the marker went: it is the user's folder now)
    other = tmp_path / "shm" / "d"
    assert stage_cache(raw_cache, other) == other
    (other / "notes.txt").write_text("mine")
    import fastdata.cache.stage as stage
    with pytest.raises(FastdataError, match=r"holds files fastdata did not stage there \(notes.txt\)"):
        stage._copy(raw_cache, other, load_manifest(raw_cache))     # a re-stage (the cache changed) over it
    assert (other / "notes.txt").read_text() == "mine" and (other / "manifest.json").exists()


def test_a_stage_that_runs_out_of_room_midway_frees_its_copy_and_falls_back(raw_cache, tmp_path, monkeypatch,
                                                                             caplog):
    """The free-space check passed but the mount filled up during the copy (another job): ENOSPC was a
    traceback, and the half copy stayed in tmpfs, holding RAM."""
    import errno

    import fastdata.cache.stage as stage

    real, copied = stage.shutil.copyfile, []

    def copyfile(a, b):
        if copied:
            raise OSError(errno.ENOSPC, "No space left on device")
        copied.append(real(a, b))

    monkeypatch.setattr(stage.shutil, "copyfile", copyfile)
    target = tmp_path / "shm" / "c"
    assert stage_cache(raw_cache, target) == raw_cache and copied
    assert "No space left on device; the partial copy was removed" in caplog.text
    assert sorted(p.name for p in target.parent.iterdir()) == [".c.stage-lock"]


def _stager(barrier, cache, target, queue) -> None:
    barrier.wait()
    try:
        queue.put(str(stage_cache(cache, target)))
    except Exception as e:  # noqa: BLE001 - reported to the test
        queue.put(f"{type(e).__name__}: {e}")


def test_ranks_staging_the_same_cache_at_once_make_one_copy(raw_cache, tmp_path):
    """torchrun's ranks on one node all pass the same stage folder: each took the others' half-made copy
    for a killed run's leftover and deleted it under them."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    barrier, queue, target = ctx.Barrier(4), ctx.Queue(), tmp_path / "shm" / "c"
    procs = [ctx.Process(target=_stager, args=(barrier, raw_cache, target, queue)) for _ in range(4)]
    for p in procs:
        p.start()
    outcomes = sorted(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert outcomes == [str(target)] * 4 and verify_cache(target).ok
    assert not (tmp_path / "shm" / "c.staging").exists()


@pytest.mark.parametrize("argv,needle", [
    (["build-cache", "/nonexistent/src", "/tmp/x"], "does not exist"),
    (["build-cache", "/dev/null", "/tmp/x"], "neither a folder nor a regular file"),
    (["verify", "/nonexistent/cache"], "does not exist; give the folder build-cache wrote"),
    (["info", "/tmp"], "not a finished fastdata cache"),
])
def test_cli_bad_input_exits_2_with_message(argv, needle, capsys):
    from fastdata.cli import main

    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_cli_unknown_format_exits_2():
    r = subprocess.run([sys.executable, "-m", "fastdata.cli", "build-cache", "a", "b", "--format", "zip"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "invalid choice" in r.stderr and "Traceback" not in r.stderr


def test_unwritable_dest(image_folder, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(BuildError, match="is a file"):
        build(image_folder, f)


def test_missing_source_creates_no_destination(tmp_path):
    dest = tmp_path / "never"
    with pytest.raises(Exception, match="nope"):
        build(tmp_path / "nope", dest)
    assert not dest.exists()


def test_unreadable_folder_in_source_is_named_and_creates_no_destination(image_folder, tmp_path, monkeypatch):
    import fastdata.cache.sources as sources

    bad = image_folder / "locked"

    def denied(self, folder, rel, ancestors):
        raise PermissionError(13, "Permission denied", str(bad))
    monkeypatch.setattr(sources._Scan, "walk", denied)
    dest = tmp_path / "never"
    with pytest.raises(SourceError, match=f"cannot scan {bad} \\(Permission denied\\); fix its permissions"):
        build(image_folder, dest)
    assert not dest.exists()


@pytest.mark.parametrize("fmt", ["h5", "pt"])
def test_shards_written_from_many_small_chunks_are_byte_identical(image_folder, tmp_path, monkeypatch, fmt):
    """The writer keeps samples in chunks it releases as it writes them (a shard is held once, not two
    or three times); chunk boundaries falling inside samples must not change a byte of the shard."""
    import hashlib

    import fastdata.cache.writers as writers

    def digests(dest):
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(dest.glob(f"*.{fmt}"))}

    build(image_folder, tmp_path / "one", workers=0, format=fmt, encode="jpeg")
    monkeypatch.setattr(writers, "CHUNK", 5000)     # JPEG samples of ~2-10 KB: most straddle a boundary
    build(image_folder, tmp_path / "many", workers=0, format=fmt, encode="jpeg")
    assert digests(tmp_path / "one") == digests(tmp_path / "many") and len(digests(tmp_path / "one")) >= 1
    samples = writers._Samples()
    for k in range(7):
        samples.append(bytes([k]) * 3000)
    assert len(samples.chunks) == 7 and samples.joined().tolist() == [k for k in range(7) for _ in range(3000)]
    assert samples.chunks == []      # each chunk released as it was copied


def test_a_shard_is_hashed_while_its_fsync_runs_and_an_error_there_leaves_it_unrenamed(tmp_path, monkeypatch):
    """atomic_replace(during=file_sha256) returns the finished file's hash (the manifest's); a failing
    fsync or hash raises before the rename, so no half-checked shard takes the final name."""
    import hashlib

    from fastdata import _util

    tmp, final = tmp_path / "shard-00000.h5.tmp", tmp_path / "shard-00000.h5"
    tmp.write_bytes(b"x" * 100_000)
    assert _util.atomic_replace(tmp, final, during=_util.file_sha256) == hashlib.sha256(b"x" * 100_000).hexdigest()
    assert final.exists() and not tmp.exists()

    tmp.write_bytes(b"y")
    monkeypatch.setattr(_util.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    with pytest.raises(OSError, match="Input/output"):
        _util.atomic_replace(tmp, final, during=_util.file_sha256)
    assert tmp.exists() and final.read_bytes() == b"x" * 100_000
