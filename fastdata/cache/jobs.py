"""The unit of build work, run wherever the executor puts it: decode one shard's inputs, write it.

Pixels never cross a process (or machine) boundary: a job reads its inputs, writes its shard
atomically into DEST (a local or shared folder) and returns only the shard's checksum record and
its quarantine list. Because a shard's content is a pure function of its items, jobs may run in
any order, anywhere, and be retried.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
from pathlib import Path

from .codecs import process_bytes, read_file
from .format import shard_name
from .writers import WRITERS

_progress = None  # per-worker shared counter, set by the pool initializer


def _init_worker(counter) -> None:
    """Pool workers ignore SIGINT: Ctrl-C reaches the whole process group, and the parent alone
    stops the pool and prints the one-line message (no traceback from every worker)."""
    global _progress
    _progress = counter
    if mp.current_process().name != "MainProcess":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # a forked worker inherits the CLI's SIGTERM handler (cli/main.py), which raises: the pool's own
        # terminate() would then print a traceback from every worker. A worker just ends on SIGTERM.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


_malloc_tuned = False


def report_progress(n: int) -> None:
    """n more inputs done, on the build's shared counter (the progress bar), where there is one."""
    if _progress is not None:
        with _progress.get_lock():
            _progress.value += n


def _tune_malloc() -> None:
    """Keep decoded images' buffers (~200 KB each) in the heap instead of a fresh mmap per image.

    Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, under which glibc hands every freed
    image buffer back to the kernel and page-faults the next one in: build jobs ran 35% slower in Dask
    workers than in the process pool (2-core box). Raising the trim and mmap thresholds with mallopt
    (once per process) made a job 16% faster than the default even in the pool."""
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-1, 64 << 20)   # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)   # M_MMAP_THRESHOLD
    except (OSError, AttributeError):   # not glibc: nothing to tune
        pass


def read_input(item, options: dict | None) -> bytes | str:
    """An input's bytes, or the reason it is quarantined; storage errors other than a missing object raise."""
    if item.problem:
        return item.problem
    if not item.path.startswith("s3://"):
        return read_file(item.path, item.span)
    from ..stores.s3 import filesystem, strip

    try:
        return filesystem(options).cat_file(strip(item.path))
    except FileNotFoundError:
        return "object not found (deleted since the listing?)"


def _input(item, codec, options: dict | None):
    """(payload, shape, crc) or a quarantine reason; storage errors other than a missing object raise."""
    data = read_input(item, options)
    return data if isinstance(data, str) else process_bytes(data, codec)


def _publish(info, local: Path, dest_url: str | None, options: dict | None):
    """Object storage DEST: upload the finished shard (one PUT, atomic for readers), drop the local copy."""
    if dest_url is None or info is None:
        return info
    from ..stores.s3 import filesystem, join, strip

    filesystem(options).put_file(str(local), strip(join(dest_url, info.name)))
    local.unlink()
    return info


def build_shard(task) -> tuple[int, object, list[dict], str | None]:
    """Worker: decode one shard's items and write it. Returns (index, ShardInfo|None, quarantined, error).
    task: (index, items, codec, format, local dest, on_error[, (dest URL or None, storage options)])."""
    _tune_malloc()
    index, items, codec, fmt, dest, on_error, *store = task
    dest_url, options = store[0] if store else (None, None)
    writer = WRITERS[fmt](Path(dest) / shard_name(index, fmt))
    quarantined, reported = [], 0
    for n, item in enumerate(items, 1):
        try:
            res = _input(item, codec, options)
        except Exception as e:  # noqa: BLE001 - storage trouble stops the build with a clear message
            from ..stores.s3 import storage_error

            return index, None, [], str(storage_error(e, item.path, "reading an input"))
        error = take(writer, quarantined, item, res, on_error)
        if error:
            return index, None, [], error
        if n % 8 == 0 or n == len(items):
            report_progress(n - reported)
            reported = n
    return _finish(index, writer, quarantined, dest, dest_url, options)


def take(writer, quarantined: list, item, res, on_error: str) -> str | None:
    """One input's result into the shard, or onto the quarantine list; under on_error=raise a bad
    input is the build's error message instead (the GPU decoder's jobs share this)."""
    if isinstance(res, str):
        if on_error == "raise":
            return (f"{item.path}: {res}; fix or remove the file, or rerun with --on-error quarantine "
                    f"(finished shards are kept and the rerun resumes)")
        quarantined.append({"path": item.key, "reason": res})
    else:
        writer.add(res[0], item.label, res[1], res[2], item.key)
    return None


def os_reason(e: OSError) -> str:
    """One line for an OSError: the errno HDF5 buries in a multi-line message ("... errno = 28,
    error message = 'No space left on device' ..."), else its strerror or text on one line."""
    text = e.strerror or str(e)
    found = re.search(r"errno = (\d+)", text)
    return os.strerror(int(found.group(1))) if found else " ".join(text.split())


def _finish(index, writer, quarantined, dest, dest_url, options):
    try:
        info = writer.close() if writer.count else None
    except OSError as e:  # disk full, DEST removed or made read-only mid-build
        writer.tmp.unlink(missing_ok=True)
        return index, None, [], (f"{writer.path}: cannot write shard ({os_reason(e)}); free space or fix "
                                 f"permissions in {dest}, then rerun the same command to resume")
    try:
        return index, _publish(info, writer.path, dest_url, options), quarantined, None
    except Exception as e:  # noqa: BLE001
        from ..stores.s3 import join, storage_error

        return index, None, [], str(storage_error(e, join(dest_url, info.name), "uploading a shard"))
