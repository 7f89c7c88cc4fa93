"""Stage a cache into tmpfs (/dev/shm) for reading, with capacity checks and fallback.

tmpfs pages are RAM charged to the writer's memory cgroup, so free space on
the mount is not enough: a container with an 8 GB limit can "fit" 100 GB in
/dev/shm and then be OOM-killed. Both limits are checked, with headroom.
If either is short, or the copy fails (the mount filled up meanwhile), staging
is skipped with a warning (a partial copy is removed, as tmpfs holds RAM) and
the original path is returned, so a job never fails because staging could not
happen.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from pathlib import Path

from .._util import cgroup_room, human_bytes, refuse_url
from ..errors import FastdataError
from .format import MANIFEST, load_manifest

log = logging.getLogger("fastdata.stage")
MARKER = ".staged-from"
HEADROOM = 0.9


def _is_tmpfs(path: Path) -> bool:
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    best, fstype = "", ""
    p = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) > 2 and (p == parts[1] or p.startswith(parts[1].rstrip("/") + "/")) and len(parts[1]) > len(best):
            best, fstype = parts[1], parts[2]
    return fstype == "tmpfs"


@contextlib.contextmanager
def _one_stager(target: Path):
    """One process at a time stages into target: torchrun's ranks on a node all call the loader with the
    same stage folder, and each deleted the others' half-made copy as a leftover of a killed run. The
    others wait here, then find the copy made. The lock file beside target is ours and stays."""
    fd = os.open(target.with_name(f".{target.name}.stage-lock"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:   # a filesystem without flock: stage unguarded, as before
            log.warning("%s: no file locks here, so processes staging at once are not kept apart", target.parent)
        yield
    finally:
        os.close(fd)


def stage_cache(cache: str | Path, target: str | Path) -> Path:
    """Copy cache to target (e.g. /dev/shm/name) and return the path to read from."""
    refuse_url(target, "stage target")
    cache, target = Path(cache), Path(target)
    m = load_manifest(cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _one_stager(target):
        if (target / MANIFEST).exists() and (target / MARKER).exists():
            if load_manifest(target).shards == m.shards:
                return target
        return _copy(cache, target, m)


def _copy(cache: Path, target: Path, m) -> Path:
    """The staging itself, under _one_stager: capacity checks, then a copy renamed into place."""
    need = sum(s.bytes for s in m.shards)
    free = shutil.disk_usage(target.parent).free
    room = cgroup_room() if _is_tmpfs(target.parent) else None
    short = []
    if need > free * HEADROOM:
        short.append(f"{target.parent} has {human_bytes(free)} free")
    if room is not None and need > room * HEADROOM:
        short.append(f"the memory cgroup has {human_bytes(room)} left")
    if short:
        log.warning("not staging %s (%s) to %s: %s; reading from %s instead",
                    cache, human_bytes(need), target, " and ".join(short), cache)
        return cache
    if target.exists() and not (target / MARKER).exists():
        raise FastdataError(f"{target} exists and was not staged by fastdata; choose a new folder to stage into")
    foreign = _foreign(target, m) if target.exists() else []
    if foreign:     # a re-stage would replace the folder: refused before the copy, not after it
        raise FastdataError(f"{target} holds files fastdata did not stage there ({', '.join(foreign[:3])}); move "
                            f"them out, or choose a new folder to stage into")
    tmp = target.with_name(target.name + ".staging")
    if tmp.exists() and unstage(tmp, m):   # a copy a killed run left behind (it carries the marker)
        raise FastdataError(f"{tmp} holds files fastdata did not stage there; move them out and stage again")
    try:
        tmp.mkdir()
        (tmp / MARKER).write_text(str(cache.resolve()))   # first, so a half copy is known to be ours
        for s in m.shards:
            shutil.copyfile(cache / s.name, tmp / s.name)
        shutil.copyfile(cache / MANIFEST, tmp / MANIFEST)
    except OSError as e:   # the mount filled up meanwhile (another job): free it, read the cache instead
        if (tmp / MARKER).exists():
            unstage(tmp, m)
        log.warning("not staging %s to %s: %s; the partial copy was removed; reading from %s instead",
                    cache, target, e.strerror or e, cache)
        return cache
    if target.exists():
        unstage(target)
    tmp.rename(target)
    log.info("staged %s (%s) to %s", cache, human_bytes(need), target)
    return target


def unstage(target: str | Path, manifest=None) -> list[str]:
    """Remove a staged copy: the files staging wrote (its marker, the manifest and the shards it names;
    `manifest`: the cache's, for a half copy that has none yet), then the folder if nothing else is in it.
    Refuses a folder fastdata did not stage. A file someone else put in the copy stays (fastdata never
    deletes a file it did not write: `rmtree` did), and its name is returned; the marker goes anyway, so
    the folder is no longer taken for a staged copy."""
    target = Path(target)
    if not (target / MARKER).exists():
        raise FastdataError(f"{target} was not staged by fastdata (no {MARKER}); not deleting it")
    left = _foreign(target, manifest)
    for e in os.scandir(target):
        if e.name not in left and e.name != MARKER:
            os.unlink(e.path)
    (target / MARKER).unlink()
    if not left:
        target.rmdir()
    return sorted(left)


def _foreign(target: Path, manifest=None) -> list[str]:
    """Names in a staged folder that staging did not write: not its marker, manifest, or a shard file
    named by its manifest or by `manifest` (the cache's)."""
    ours = {MARKER, MANIFEST}
    for m in (manifest, _manifest_or_none(target)):
        ours |= {s.name for s in m.shards} if m is not None else set()
    return sorted(e.name for e in os.scandir(target) if e.name not in ours or not e.is_file(follow_symlinks=False))


def _manifest_or_none(folder: Path):
    try:
        return load_manifest(folder)
    except Exception:  # noqa: BLE001 - a half copy has no manifest yet: only the given one names its shards
        return None
