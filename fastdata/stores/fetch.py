"""A cache in object storage, read through a bounded local folder of shards fetched ahead.

The reader never maps a remote object: ``get(i)`` returns a local path of shard i, which was
downloaded to ``name.part-PID-N``, checked against the manifest's size and sha256 and renamed into
place (atomic publish: a killed fetch leaves only a .part, never a half shard under its name).
``read_ahead(ids)`` gives the order in which the loader will first touch shards (it follows the
sample order); background threads fetch along it while the shards fetched but not yet used stay
under half the folder's limit. When room is needed, shards already used are evicted, least
recently used first. A folder that is warm from an earlier run is used as is (size checked; the
loader's integrity mode hashes shards on first use).

Failures: a fetch is retried (3 attempts); then the error names the object URL and the fix.
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import os
import stat
import threading
import time
import weakref
from collections import Counter, OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .._util import parse_size
from ..errors import CacheFormatError, FastdataError
from .s3 import filesystem, join, storage_error, strip

log = logging.getLogger("fastdata.stores")
ATTEMPTS = 3
_part_ids = itertools.count()


@dataclass(frozen=True, kw_only=True)
class RemoteConfig:
    storage_options: dict | None = None   # s3fs options (endpoint_url, key, secret, ...); None: environment
    folder: str | None = None             # local shard folder; None: ~/.cache/fastdata/shards/<url digest>
    limit: str | int = "20GB"             # bytes the folder may hold
    threads: int = 4                      # parallel fetches


def default_folder(url: str) -> Path:
    root = Path(os.environ.get("FASTDATA_SHARD_CACHE", Path.home() / ".cache" / "fastdata" / "shards"))
    return root / hashlib.sha256(url.encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


class RemoteShards:
    """The object-storage shard store (stores/local.py names the interface): shards fetched ahead of
    the sample order into a bounded local folder, checked against their sha256, evicted LRU."""

    evicts = True
    verified = True

    def __init__(self, url: str, shards, cfg: RemoteConfig, on_evict=None) -> None:
        self.url, self.shards, self.cfg = url.rstrip("/"), list(shards), cfg
        self.folder = Path(cfg.folder) if cfg.folder else default_folder(self.url)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.limit = parse_size(cfg.limit)
        biggest = max((s.bytes for s in self.shards), default=0)
        if self.limit < 2 * biggest:
            raise FastdataError(f"{url}: a local shard folder of {self.limit} B cannot hold two of its shards "
                                f"({biggest} B each); raise RemoteConfig(limit=...) to at least {2 * biggest}")
        self.fs = filesystem(cfg.storage_options)
        self._pool = ThreadPoolExecutor(max(1, cfg.threads), thread_name_prefix="fastdata-fetch")
        self._lock = threading.RLock()
        self._jobs: dict[int, Future] = {}
        self._used: OrderedDict[int, None] = OrderedDict()   # shards handed out, least recent first
        self._sequence: list[int] = []
        self._pins: Counter[int] = Counter()
        self._listeners: list = []
        if on_evict:
            self.add_listener(on_evict)

    def add_listener(self, on_evict) -> None:
        """on_evict(i) is called when shard i's file is deleted (caches drop their mapping of it)."""
        with self._lock:   # weakly: a cache that is gone must not be kept alive by the shared folder
            self._listeners.append(weakref.WeakMethod(on_evict) if hasattr(on_evict, "__self__") else
                                   (lambda f=on_evict: f))

    def path(self, i: int) -> Path:
        return self.folder / self.shards[i].name

    # ---- fetching ---------------------------------------------------------------------------------
    def _download(self, i: int) -> Path:
        info, final = self.shards[i], self.path(i)
        try:   # one stat: an eviction on another thread may delete the file between two checks
            st = final.stat()
            if stat.S_ISREG(st.st_mode) and st.st_size == info.bytes:
                return final                               # warm folder (get() re-checks it still exists)
        except FileNotFoundError:
            pass
        url = join(self.url, info.name)
        tmp = final.with_name(f"{info.name}.part-{os.getpid()}-{next(_part_ids)}")
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self.fs.get_file(strip(url), str(tmp))
                if tmp.stat().st_size != info.bytes or _sha256(tmp) != info.sha256:
                    raise CacheFormatError(f"{url}: fetched {tmp.stat().st_size} B whose sha256 differs from "
                                           f"manifest.json; the object is damaged or was replaced; rebuild the cache")
                os.replace(tmp, final)
                return final
            except CacheFormatError:
                tmp.unlink(missing_ok=True)
                raise
            except Exception as e:  # noqa: BLE001 - network and storage errors: retried, then named
                tmp.unlink(missing_ok=True)
                if attempt == ATTEMPTS:
                    raise storage_error(e, url, f"fetching shard {info.name}") from None
                log.warning("fetch of %s failed (%s), retrying", url, type(e).__name__)
                time.sleep(0.2 * attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _start(self, i: int) -> Future:
        with self._lock:
            job = self._jobs.get(i)
            if job is None or (job.done() and job.exception() is not None):
                self._make_room(self.shards[i].bytes)
                job = self._jobs[i] = self._pool.submit(self._download, i)
            return job

    def get(self, i: int) -> Path:
        """The local path of shard i, fetching it now if it was not fetched ahead. The file is pinned
        (never evicted) until release(i): the caller maps it first; a mapping outlives an unlink."""
        while True:
            path = self._start(i).result()
            with self._lock:
                if path.exists():   # not evicted between the fetch and now
                    self._pins[i] += 1
                    self._used.pop(i, None)
                    self._used[i] = None
                    break
                self._jobs.pop(i, None)
        self._fill()
        return path

    def release(self, i: int) -> None:
        with self._lock:
            self._pins[i] -= 1

    def read_ahead(self, ids) -> None:
        """The order in which shards will first be needed (the loader's sample order)."""
        with self._lock:
            self._sequence = list(dict.fromkeys(int(i) for i in ids))
        self._fill()

    def _fill(self) -> None:
        with self._lock:
            if self._listeners and all(ref() is None for ref in self._listeners):
                self._sequence = []   # every cache that read through this folder is gone: stop fetching ahead
                return
            ahead = sum(self.shards[i].bytes for i in self._jobs if i not in self._used)
            for i in self._sequence:
                if i in self._jobs or i in self._used:
                    continue
                if ahead + self.shards[i].bytes > self.limit // 2:
                    break
                ahead += self.shards[i].bytes
                self._start(i)
            self._sequence = [i for i in self._sequence if i not in self._jobs]

    def _make_room(self, nbytes: int) -> None:
        """Evict shards already used, least recently first, until nbytes more fit under the limit."""
        held = sum(self.shards[i].bytes for i, j in self._jobs.items() if not j.done() or j.exception() is None)
        for i in list(self._used):
            if held + nbytes <= self.limit:
                break
            if self._pins[i] > 0:
                continue
            self._used.pop(i)
            self._jobs.pop(i, None)
            self.path(i).unlink(missing_ok=True)
            for ref in self._listeners:
                if (listener := ref()) is not None:
                    listener(i)
            held -= self.shards[i].bytes

    def join(self) -> None:
        """Wait for the fetches in flight (their errors surface in get(), not here)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.exception()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


_shared: dict[tuple, RemoteShards] = {}
_shared_lock = threading.Lock()


def shared(url: str, shards, cfg: RemoteConfig, on_evict) -> RemoteShards:
    """One RemoteShards per (url, folder, shards) in a process: every loader of the same cache shares
    its folder, its budget and its read-ahead, and no loader evicts a file another just fetched."""
    folder = str(Path(cfg.folder) if cfg.folder else default_folder(url.rstrip("/")))
    key = (os.getpid(), url.rstrip("/"), folder, tuple(s.sha256 for s in shards))
    with _shared_lock:
        rs = _shared.get(key)
        if rs is None:
            rs = _shared[key] = RemoteShards(url, shards, cfg)
        rs.add_listener(on_evict)
        return rs


def fetch_manifest(url: str, options: dict | None) -> dict:
    import json

    fs = filesystem(options)
    where = join(url.rstrip("/"), "manifest.json")
    try:
        raw = fs.cat_file(strip(where))
    except FileNotFoundError:
        raise CacheFormatError(f"{where}: not found, so {url} is not a finished fastdata cache (build one with: "
                               f"fastdata build-cache SRC {url})") from None
    except Exception as e:  # noqa: BLE001
        raise storage_error(e, where, "reading the manifest") from None
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CacheFormatError(f"{where}: cannot read manifest ({e}); rebuild the cache") from None
