"""Small shared helpers: atomic writes, usable CPUs, byte-size parsing, hashing."""
from __future__ import annotations

import concurrent.futures
import errno
import hashlib
import json
import math
import os
import re
from pathlib import Path

from .errors import FastdataError

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def parse_size(text: str | int) -> int:
    """'256MB' -> 256_000_000, '1GiB' -> 2**30. Ints pass through."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise FastdataError(f"cannot read size {text!r}: use a number with an optional unit, e.g. 256MB or 1GiB")
    unit = (m.group(2) or "").upper().rstrip("B")
    return int(float(m.group(1)) * _UNITS[unit])


def usable_cpus() -> int:
    """CPUs this process may run on, not the host's total: its affinity (a cpuset), and its cgroup's CPU
    quota. A Kubernetes pod limited to 8 CPUs on a 96-core node sees 96 in its affinity; 96 build workers
    there are throttled to 8 CPUs' time and each holds its own buffers against the pod's memory limit."""
    try:
        cpus = max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        cpus = max(1, os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return cpus if quota is None else max(1, min(cpus, math.ceil(quota)))


def _quota_at(folder: Path) -> float | None:
    """CPUs the CFS quota of one cgroup folder allows (v2 cpu.max, or v1 cfs_quota/period), or None."""
    try:
        if (folder / "cpu.max").is_file():
            quota, period = (folder / "cpu.max").read_text().split()
            return None if quota == "max" else int(quota) / int(period)
        quota = int((folder / "cpu.cfs_quota_us").read_text())
        return None if quota <= 0 else quota / int((folder / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None


def _cgroup_folders(controller: str, root: Path, proc: Path) -> list[Path]:
    """This process's cgroup folders for one controller (v1 or v2), each from its leaf up to the
    controller's root, for the limits of every level (a pod's limit sits above its container's)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":
            base = root
        elif controller in controllers.split(","):
            base = next((p for p in (root / controllers, root / controller, root / f"{controller},cpuacct")
                         if p.is_dir()), None)
            if base is None:
                continue
        else:
            continue
        # inside a container the path may be the host's (not mounted here): its root is the container's
        folder = base / rel.lstrip("/")
        while True:
            if folder.is_dir():
                folders.append(folder)
            if folder == base:
                break
            folder = folder.parent
    return folders


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> float | None:
    """The tightest CPU quota on this process's cgroup path, up to the root (v1 or v2), in CPUs."""
    found = [q for q in map(_quota_at, _cgroup_folders("cpu", root, proc)) if q is not None]
    return min(found) if found else None


# fsync of a folder, where a filesystem does not do it (CIFS/SMB, some FUSE and NFS mounts): the
# rename is then as durable as that filesystem makes it, and the build goes on
_NO_DIR_FSYNC = {errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EBADF, errno.ENOSYS, errno.EACCES}


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename inside it survives a power cut (where the filesystem can)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        if e.errno in _NO_DIR_FSYNC:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _NO_DIR_FSYNC:
            raise
    finally:
        os.close(fd)


def atomic_replace(tmp: Path, final: Path, during=None):
    """fsync tmp, rename it over final, fsync the folder: readers see old or new, never half.
    during(tmp), where given, runs while the fsync waits on the disk (a shard's hash, read back from the
    page cache), and its result is returned: the two took 0.20 s and 0.07-0.12 s in turn for a 256 MB
    file on the 2-core box."""
    with open(tmp, "rb") as f:
        if during is None:
            os.fsync(f.fileno())
            out = None
        else:
            with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="fastdata-fsync") as pool:
                synced = pool.submit(os.fsync, f.fileno())
                try:
                    out = during(tmp)
                finally:
                    synced.result()
    os.replace(tmp, final)
    fsync_dir(final.parent)
    return out


def write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    atomic_replace(tmp, path)


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


def user_path(path):
    """`~/data` -> the home folder's data, as torchvision's datasets take it (a quoted '~' reaches us
    unexpanded, and Python strings never are); anything else unchanged."""
    if isinstance(path, (str, Path)) and str(path).startswith("~"):
        return type(path)(os.path.expanduser(str(path)))
    return path


def refuse_url(text: str | Path, what: str) -> None:
    """Object storage is not supported yet: a scheme:// path would become a local folder named 's3:'."""
    scheme, sep, _ = str(text).partition("://")
    if sep and scheme and scheme.replace("+", "").replace(".", "").replace("-", "").isalnum():
        raise FastdataError(f"{what} {text}: {scheme}:// URLs are not supported here; fastdata reads and writes "
                            f"local folders, and s3:// (any S3-compatible endpoint) for build-cache SRC/DEST, "
                            f"verify, info and the loader")


def _memory_at(folder: Path) -> tuple[int, int] | None:
    """(limit, usage) of one memory cgroup folder (v2 memory.max/current, v1 limit/usage_in_bytes), or
    None without a limit there."""
    v2 = (folder / "memory.max").is_file()
    names = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
    try:
        limit, usage = (folder / names[0]).read_text().strip(), int((folder / names[1]).read_text())
    except (OSError, ValueError):
        return None
    return (int(limit), usage) if limit != "max" and int(limit) < 1 << 60 else None


def _cgroup_memory(root: Path = Path("/sys/fs/cgroup"),
                   proc: Path = Path("/proc/self/cgroup")) -> tuple[int, int] | None:
    """(the smallest limit, the least room left) in bytes over the levels of this process's memory
    cgroup path (v1 or v2), or None without a limit on it."""
    found = [m for m in map(_memory_at, _cgroup_folders("memory", root, proc)) if m is not None]
    return (min(m[0] for m in found), max(0, min(m[0] - m[1] for m in found))) if found else None


def cgroup_room() -> int | None:
    """Bytes this process's memory cgroup can still take (v1 or v2), or None without a limit."""
    found = _cgroup_memory()
    return None if found is None else found[1]


def _meminfo(field: str) -> int | None:
    """A /proc/meminfo field in bytes (MemTotal, MemAvailable, ...), or None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_total() -> int:
    """The RAM this process may use (0 where unknown): the machine's, or its memory cgroup's limit where
    that is smaller (a Kubernetes pod limited to 16 GB on a 512 GB node plans for 16 GB)."""
    cgroup = _cgroup_memory()
    known = [x for x in (_meminfo("MemTotal"), cgroup[0] if cgroup else None) if x]
    return min(known) if known else 0


def memory_budget() -> int:
    """Bytes this process can still fill with data: the smaller of MemAvailable and its cgroup's room
    (page cache is charged to the cgroup, so a mapped cache counts)."""
    known = [x for x in (_meminfo("MemAvailable"), cgroup_room()) if x is not None]
    return min(known) if known else 1 << 62


def first_array(batch):
    """The first array-like (anything with .shape) in a collated batch of any structure: an (x, y)
    tuple, a dict as Hugging Face datasets give, a bare tensor; None where there is none. No torch
    import: the doctor's bootstrap runs this inside the user's process."""
    if hasattr(batch, "shape"):
        return batch
    parts = batch.values() if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else ()
    for part in parts:
        found = first_array(part)
        if found is not None:
            return found
    return None


def batch_len(batch) -> int:
    """Samples in a collated batch: its first array's first dimension, else the length of its first
    list (a batch of strings), else 1."""
    x = first_array(batch)
    if x is not None:
        return int(x.shape[0]) if len(x.shape) else 1
    parts = list(batch.values()) if isinstance(batch, dict) else batch if isinstance(batch, (list, tuple)) else []
    return len(parts[0]) if parts and isinstance(parts[0], (list, tuple)) else (len(parts) or 1)
