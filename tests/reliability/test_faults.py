"""Fault injection across the pipeline (CPU, bounded in time): the promises hold under failure."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fastdata
from fastdata.cache.format import load_manifest
from fastdata.cache.verify import verify_cache
from fastdata.read.dataset import CacheDataset
from fastdata.errors import BuildError, LoaderError
from fastdata.sample import make_corrupt_zoo

from helpers import build, kill_build_after

ROOT = Path(__file__).resolve().parents[2]


def _hashes(dest):
    return [(s.name, s.count, s.sha256) for s in load_manifest(dest).shards]


def test_corrupt_zoo_every_bad_kind_quarantined_none_good_lost(photos, image_folder, tmp_path):
    src = tmp_path / "src"
    expect = make_corrupt_zoo(src, photos["astronaut"])
    bad = {k for k, v in expect.items() if v == "bad"}
    assert len(bad) >= 10
    os.symlink(image_folder, src / "good")  # 120 good photos beside the zoo
    m = build(src, tmp_path / "c", workers=2).manifest
    assert {q["path"] for q in m.quarantined} == bad
    assert all(len(q["reason"]) > 5 for q in m.quarantined)
    assert m.num_samples == 120 + len(expect) - len(bad)


def test_ten_kills_then_resume_is_identical(image_folder, tmp_path):
    clean = tmp_path / "clean"
    m = build(image_folder, clean, workers=2, size=128, shard_size="120KB").manifest
    dest = tmp_path / "killed"
    cmd = [sys.executable, "-m", "fastdata.cli", "build-cache", str(image_folder), str(dest), "--size", "128",
           "--shard-size", "120KB", "--workers", "2", "--no-progress"]
    rng = np.random.default_rng(7)
    targets = sorted(int(t) for t in rng.integers(0, len(m.shards) - 1, 10))
    landed = sum(kill_build_after(cmd, dest, t, float(rng.uniform(0, 0.05))) for t in targets)
    assert landed == 10, f"only {landed} of 10 kills landed mid-build"
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert _hashes(dest) == _hashes(clean)
    a, b = CacheDataset(dest), CacheDataset(clean)
    assert all(np.array_equal(a[i][0].numpy(), b[i][0].numpy()) for i in range(0, len(a), 9))


def test_hdf5s_multi_line_write_error_becomes_one_line():
    """h5py reports a full disk as one OSError whose text spans lines (seen on a full tmpfs); the
    build's error must stay one line naming the cause."""
    from fastdata.cache.jobs import os_reason

    h5 = OSError(None, "Can't synchronously write data (file write failed: time = Sat Dec  5 06:27:39 2026\n"
                       ", filename = 'c/shard-00003.h5.tmp', errno = 28, error message = 'No space left on "
                       "device', buf = 0x5, total write size = 22528)")
    assert os_reason(h5) == "No space left on device"
    assert os_reason(OSError(13, "Permission denied")) == "Permission denied"
    assert os_reason(OSError("two\nlines")) == "two lines"


def test_disk_full_mid_build_is_clear_and_resumable(image_folder, tmp_path, monkeypatch):
    import fastdata.cache.writers as writers

    real = writers.H5ShardWriter._write
    calls = {"n": 0}

    def full_disk(self, *args):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError(28, "No space left on device")
        return real(self, *args)

    monkeypatch.setattr(writers.H5ShardWriter, "_write", full_disk)
    dest = tmp_path / "c"
    with pytest.raises(BuildError, match="No space left on device.*rerun the same command to resume"):
        build(image_folder, dest, workers=0, shard_size="60KB")
    journal = json.loads((dest / ".build" / "journal.json").read_text())
    assert len(journal["shards"]) == 2 and not list(dest.glob("*.tmp"))
    monkeypatch.setattr(writers.H5ShardWriter, "_write", real)
    resumed = build(image_folder, dest, workers=0, shard_size="60KB")
    assert resumed.resumed_shards == 2
    build(image_folder, tmp_path / "clean", workers=0, shard_size="60KB")
    assert _hashes(dest) == _hashes(tmp_path / "clean")


def test_a_filesystem_without_flock_or_folder_fsync_still_builds(image_folder, tmp_path, monkeypatch, caplog):
    """Lustre mounted noflock answers flock with ENOSYS, NFS without lockd with ENOLCK, and CIFS or some
    FUSE mounts refuse fsync on a folder (EINVAL): each was a traceback before any shard was written."""
    import errno
    import fcntl

    import fastdata._util as util
    import fastdata.cache.journal as journal

    def no_flock(fd, op):
        raise OSError(errno.ENOSYS, "Function not implemented")

    real_fsync = os.fsync

    def no_dir_fsync(fd):
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fsync(fd)

    monkeypatch.setattr(journal.fcntl, "flock", no_flock)
    monkeypatch.setattr(util.os, "fsync", no_dir_fsync)
    with caplog.at_level("WARNING", logger="fastdata.build"):
        res = build(image_folder, tmp_path / "c", workers=0, shard_size="60KB")
    assert "does not support file locks (Function not implemented)" in caplog.text
    assert res.manifest.num_samples == 120 and (tmp_path / "c" / "manifest.json").exists()
    monkeypatch.setattr(journal.fcntl, "flock", fcntl.flock)
    monkeypatch.setattr(util.os, "fsync", real_fsync)
    build(image_folder, tmp_path / "clean", workers=0, shard_size="60KB")
    assert _hashes(tmp_path / "c") == _hashes(tmp_path / "clean")

    def broken_disk(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(util.os, "fsync", broken_disk)     # a real I/O error still stops the build
    with pytest.raises(BuildError, match="Input/output error"):
        build(image_folder, tmp_path / "eio", workers=0, shard_size="60KB")


def test_shards_build_and_read_where_every_flock_fails(image_folder, tmp_path):
    """NFS without lockd: every flock() is ENOLCK. HDF5 locks each file it opens unless told not to, so
    the build failed with 'cannot write shard (No locks available); free space ...' and the loader
    called an intact cache damaged. flock is made to fail for real, in C, under LD_PRELOAD."""
    import shutil

    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the flock shim")
    shim = tmp_path / "noflock.c"
    shim.write_text("#include <errno.h>\nint flock(int fd, int op) { errno = ENOLCK; return -1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "noflock.so"), str(shim)], check=True)
    code = ("import sys, fastdata\n"
            "from fastdata.cache.build import BuildConfig, build_cache\n"
            "build_cache(BuildConfig(src=sys.argv[1], dest=sys.argv[2], size=32, workers=0, progress=False))\n"
            "print(sum(len(b[1]) for b in fastdata.loader(sys.argv[2], 16, device='cpu')))\n")
    env = {**os.environ, "LD_PRELOAD": str(tmp_path / "noflock.so")}
    out = subprocess.run([sys.executable, "-c", code, str(image_folder), str(tmp_path / "c")], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["120"] and "does not support file locks (No locks available)" in out.stderr


def test_a_finished_cache_on_a_read_only_mount_is_a_one_line_error(image_folder, tmp_path, monkeypatch):
    """Rerunning the build of a cache now mounted read-only raised OSError from the build lock."""
    import errno

    import fastdata.cache.journal as journal

    build(image_folder, tmp_path / "c", workers=0)
    real_open = journal.os.open

    def read_only(path, flags, *mode):
        if flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *mode)

    monkeypatch.setattr(journal.os, "open", read_only)
    with pytest.raises(BuildError, match=r"DEST .*c is not writable \(Read-only file system\).*fastdata verify"):
        build(image_folder, tmp_path / "c", workers=0)
    assert verify_cache(tmp_path / "c").ok


def test_every_single_byte_flip_is_found(image_folder, tmp_path):
    dest = tmp_path / "c"
    build(image_folder, dest, workers=0)
    m = load_manifest(dest)
    rng = np.random.default_rng(3)
    for trial in range(12):
        info = m.shards[int(rng.integers(len(m.shards)))]
        path = dest / info.name
        original = path.read_bytes()
        pos = int(rng.integers(len(original)))
        flipped = bytearray(original)
        flipped[pos] ^= 1 << int(rng.integers(8))
        path.write_bytes(bytes(flipped))
        try:
            report = verify_cache(dest)
            assert not report.ok and list(report.damaged) == [info.name], (trial, pos)
        finally:
            path.write_bytes(original)
    assert verify_cache(dest).ok


def test_reader_thread_failure_is_reported_with_cause(raw_cache, monkeypatch):
    import fastdata.read.backends.raw as loader_mod

    def boom(cache, idx, slot, read):
        raise MemoryError("planted: could not allocate")

    monkeypatch.setattr(loader_mod, "fill_batch", boom)
    with pytest.raises(LoaderError, match=r"reader failed on batch 0 of epoch 0: MemoryError: planted"):
        list(fastdata.loader(raw_cache, 8, device="cpu"))


def test_dataloader_worker_death_is_reported(raw_cache):
    from torch.utils.data import DataLoader

    class Dies(CacheDataset):
        def __getitem__(self, i):
            if i == 5:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().__getitem__(i)

    with pytest.raises(RuntimeError, match="DataLoader worker .* (killed by signal|exited unexpectedly)"):
        list(DataLoader(Dies(raw_cache), 4, num_workers=1, shuffle=False))


CRASHER = """
import sys, pickle, fastdata
cache, state_path, crash_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
dl = fastdata.loader(cache, 8, device="cpu", seed=11)
if crash_at < 0:
    dl.load_state_dict(pickle.load(open(state_path, "rb")))
seen = []
for k, b in enumerate(dl):
    seen += b.indices.tolist()
    pickle.dump(dl.state_dict(), open(state_path + ".tmp", "wb"))
    import os; os.replace(state_path + ".tmp", state_path)   # checkpoint after every batch
    print(*b.indices.tolist(), flush=True)
    if k == crash_at:
        os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("crash_at", [0, 6, 13])
def test_resume_after_crash_yields_each_remaining_sample_once(raw_cache, tmp_path, crash_at):
    script = tmp_path / "crasher.py"
    script.write_text(CRASHER)
    state = tmp_path / "state.pkl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.run([sys.executable, script, str(raw_cache), str(state), str(crash_at)], env=env,
                           capture_output=True, text=True)
    assert first.returncode == -9
    second = subprocess.run([sys.executable, script, str(raw_cache), str(state), "-1"], env=env,
                            capture_output=True, text=True, check=True)
    before = [int(x) for line in first.stdout.split("\n") for x in line.split()]
    after = [int(x) for line in second.stdout.split("\n") for x in line.split()]
    assert len(before) == 8 * (crash_at + 1)
    assert sorted(before + after) == list(range(120))


def test_checkpoint_killed_while_writing_is_never_half_read(tmp_path):
    code = f"""
import torch, sys
sys.path.insert(0, {str(ROOT)!r})
from fastdata.engine.checkpoint import save_checkpoint
big = {{"w": torch.randn(32, 1024, 1024)}}
save_checkpoint({str(tmp_path / 'last.pt')!r}, {{"step": 1, "w": torch.zeros(1)}})
print("first", flush=True)
while True:
    save_checkpoint({str(tmp_path / 'last.pt')!r}, {{"step": 2, **big}})
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "first"
    time.sleep(1.5)
    proc.kill()
    proc.wait()
    from fastdata.engine.checkpoint import load_checkpoint

    state = load_checkpoint(tmp_path / "last.pt")  # whole old or whole new, never a torn file
    assert state["step"] in (1, 2)


def test_a_worker_killed_mid_shard_ends_the_build_resumably(image_folder, tmp_path):
    """The OOM killer's SIGKILL on one pool worker: multiprocessing.Pool replaced the worker, lost its shard
    job and the build waited for it forever (seen at 98%). Now the build stops with a message and exit 2,
    and the rerun resumes to the same bytes as a clean build. In a child with a timeout: a regression hangs."""
    victim = sorted(image_folder.rglob("*.jpg"))[-1]
    code = ("import os, signal, sys\n"
            "import fastdata.cache.jobs as jobs\n"
            "from fastdata.cli import main\n"
            "victim, real = open(sys.argv[1], 'rb').read(), jobs.process_bytes\n"
            "def oom(data, codec):\n"
            "    if data == victim:\n"
            "        os.kill(os.getpid(), signal.SIGKILL)\n"
            "    return real(data, codec)\n"
            "jobs.process_bytes = oom   # the pool's workers fork from this process\n"
            "sys.exit(main(['build-cache', sys.argv[2], sys.argv[3], '--workers', '2', '--shard-size', '60KB',\n"
            "               '--size', '64']))\n")
    out = subprocess.run([sys.executable, "-c", code, str(victim), str(image_folder), str(tmp_path / "c")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "a build worker process died" in out.stderr, out.stderr[-1500:]
    assert "rerun the same command to resume" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "c" / "manifest.json").exists()
    build(image_folder, tmp_path / "c", workers=2, shard_size="60KB")
    build(image_folder, tmp_path / "clean", workers=0, shard_size="60KB")
    assert _hashes(tmp_path / "c") == _hashes(tmp_path / "clean")
