"""Faults found by independent checks (issue #18): Ctrl-C in a pool, racing builds, manifest damage."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastdata.cache.format import canonical_sha256, load_manifest
from fastdata.cache.verify import verify_cache
from fastdata.cli import main
from fastdata.read.dataset import CacheDataset
from fastdata.errors import BuildError, CacheFormatError

from helpers import build, terminal_signals

ROOT = Path(__file__).resolve().parents[2]


def _long_list(image_folder: Path, tmp_path: Path, copies: int = 8) -> Path:
    """A file list naming every photo `copies` times: a build long enough to interrupt."""
    photos = sorted(image_folder.rglob("*.jpg"))
    lst = tmp_path / "list.csv"
    lst.write_text("".join(f"{p},{j % 10}\n" for _ in range(copies) for j, p in enumerate(photos)))
    return lst


def _start_long_build(image_folder: Path, tmp_path: Path):
    """(process, command, DEST) of a 2-worker CLI build of 960 inputs, once its first shard is journaled."""
    lst, dest = _long_list(image_folder, tmp_path), tmp_path / "c"
    cmd = [sys.executable, "-m", "fastdata.cli", "build-cache", str(lst), str(dest), "--workers", "2",
           "--size", "256", "--shard-size", "2MB", "--no-progress"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=ROOT,
                            preexec_fn=terminal_signals)
    journal = dest / ".build" / "journal.json"
    deadline = time.time() + 60
    while proc.poll() is None and time.time() < deadline and not journal.exists():
        time.sleep(0.01)
    return proc, cmd, dest


def test_ctrl_c_stops_the_pool_without_worker_tracebacks_and_resumes(image_folder, tmp_path):
    proc, cmd, dest = _start_long_build(image_folder, tmp_path)
    os.killpg(proc.pid, signal.SIGINT)   # what the terminal does: every process of the group gets it
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.strip().splitlines() == ["fastdata build-cache: interrupted; rerun the same command to resume"]
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode == 0
    assert verify_cache(dest).ok and load_manifest(dest).num_samples == 8 * 120


def _racer(barrier, src, dest, queue) -> None:
    barrier.wait()
    try:
        build(src, dest, workers=0, size=32)
        queue.put("ok")
    except BuildError as e:
        queue.put(str(e))


def test_builds_released_together_are_refused_by_the_lock_not_by_a_probe_file(image_folder, tmp_path):
    ctx = mp.get_context("fork")
    outcomes = []
    for r in range(12):
        barrier, queue = ctx.Barrier(4), ctx.Queue()
        dest = tmp_path / f"round{r}"
        procs = [ctx.Process(target=_racer, args=(barrier, image_folder, dest, queue)) for _ in range(4)]
        for p in procs:
            p.start()
        got = [queue.get(timeout=120) for _ in procs]
        for p in procs:
            p.join()
        outcomes += got
        assert "ok" in got and verify_cache(dest).ok
    odd = [o for o in outcomes if o != "ok" and "another build is writing here" not in o]
    assert not odd, odd


def _edit(dest: Path, change, keep_checksum: bool = False) -> None:
    path = dest / "manifest.json"
    d = json.loads(path.read_text())
    change(d)
    if keep_checksum:   # a consistent forgery: the checksum alone cannot catch it
        d["manifest_sha256"] = canonical_sha256(d)
    path.write_text(json.dumps(d))


def _flip_digit(d):
    s = d["shards"][0]["sha256"]
    d["shards"][0]["sha256"] = ("1" if s[0] != "1" else "2") + s[1:]


def _count(d):
    d["shards"][0]["count"] += 1
    d["num_samples"] += 1


def _class(d):
    d["label_map"] = {("X" + k if i == 0 else k): v for i, (k, v) in enumerate(d["label_map"].items())}


@pytest.mark.parametrize("change", [_flip_digit, _count, _class], ids=["sha-digit", "count", "class-name"])
def test_edited_manifest_is_refused_by_verify_and_loader_naming_it(image_folder, tmp_path, change, capsys):
    dest = tmp_path / "c"
    build(image_folder, dest, workers=0)
    _edit(dest, change)
    assert main(["verify", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "manifest.json: the manifest does not match its own checksum" in err
    assert "rebuild them" not in err   # an intact shard is not blamed
    with pytest.raises(CacheFormatError, match="manifest.json"):
        CacheDataset(dest)


def test_non_utf8_byte_in_manifest_is_a_clear_error(image_folder, tmp_path, capsys):
    dest = tmp_path / "c"
    build(image_folder, dest, workers=0)
    raw = (dest / "manifest.json").read_bytes()
    (dest / "manifest.json").write_bytes(raw[:50] + b"\xff" + raw[51:])
    assert main(["verify", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "manifest.json: cannot read manifest" in err and "Traceback" not in err


def test_counts_are_cross_checked_against_the_shards(image_folder, tmp_path):
    dest = tmp_path / "c"
    build(image_folder, dest, workers=0)
    _edit(dest, _count, keep_checksum=True)
    name = load_manifest(dest).shards[0].name
    with pytest.raises(CacheFormatError, match=f"{name}: holds \\d+ samples but manifest.json says"):
        CacheDataset(dest)[0]
    _edit(dest, lambda d: d.update(num_samples=d["num_samples"] + 5), keep_checksum=True)
    with pytest.raises(CacheFormatError, match="num_samples .* the shards' sum"):
        load_manifest(dest)


def test_sigterm_to_the_build_stops_its_workers_and_resumes(image_folder, tmp_path):
    """`docker stop` or Slurm's time limit: SIGTERM to the build process alone. Python's default ended it on
    the spot and left the pool's workers running; now it unwinds like Ctrl-C, exit 143."""
    proc, cmd, dest = _start_long_build(image_folder, tmp_path)
    workers = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.strip().splitlines() == ["fastdata build-cache: terminated (SIGTERM); rerun the same command to resume"]
    for pid in workers:   # none left running (reaped, or at most a zombie of the finished group)
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().split(") ")[1].startswith("Z"), pid
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode == 0
    assert verify_cache(dest).ok and load_manifest(dest).num_samples == 8 * 120
