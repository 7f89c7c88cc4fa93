"""build_cache(cfg): decode every input once, in parallel, into checksummed shards.

The unit of work is a whole shard: shard k holds input items
[k * per_shard, (k + 1) * per_shard) (minus quarantined ones), where
per_shard depends only on the settings and the number of inputs. Each
worker process decodes its shard's items, writes the shard atomically and
returns its checksum, so pixels never cross a process boundary and the
single parent only keeps the journal. Because a shard's content is a pure
function of its items, shards can finish in any order, and a resume after
kill -9 redoes exactly the shards the journal does not vouch for.
"""
from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tqdm import tqdm

from .._util import human_bytes, parse_size, usable_cpus, user_path, write_json_atomic
from ..errors import BuildError, FastdataError, SourceError
from .codecs import CodecConfig, check_codec
from .executors import shard_map
from .format import MANIFEST, SHARD_FORMATS, Manifest, load_manifest
from .journal import (BuildLock, Journal, clean_strays, fingerprint, inputs_digest, journal_from_manifest,
                      labels_digest, load_journal)
from ..stores.s3 import is_url, redact
from . import remote_dest
from .sources import Item, discover, is_cache_dir, partition, refuse_url, split_hint, with_classes

log = logging.getLogger("fastdata.build")
MIN_SHARDS = 64         # large data sets are cut into >= 64 shards to keep 64 workers busy; small ones
#                         keep >= 64 items a shard, since each shard costs a file, fsyncs and a checksum
JPEG_RATIO = 10         # bytes estimate for cutting JPEG shards: raw size / 10 at quality ~90


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    src: str
    dest: str
    format: str = "h5"             # h5 | pt
    encode: str = "raw"            # raw | jpeg | bytes
    size: int = 256
    resize: str = "fixed"          # fixed | short | max | none
    quality: int = 90
    shard_size: str | int = "256MB"
    workers: int | None = None     # None: every usable CPU; 0: in this process
    on_error: str = "quarantine"   # quarantine | raise
    part: tuple[int, int] | None = None
    progress: bool = True
    executor: str = "local"        # local (process pool) | dask (LocalCluster) | dask://HOST:PORT (executors.py)
    storage_options: dict | None = None   # s3:// SRC/DEST: s3fs options (never recorded unredacted)
    allow_empty_classes: bool = False   # keep class folders without images as labels (ImageFolder allow_empty)
    decoder: str = "cpu"           # cpu (PIL, in the executor's workers) | nvjpeg (GPU, in the workers: gpu_build.py)
    classes_from: str | None = None   # a cache whose label map numbers SRC's classes (sources.with_classes)

    def validate(self) -> None:
        checks = [
            (self.format in SHARD_FORMATS, f"--format {self.format!r}: choose one of {', '.join(SHARD_FORMATS)}"),
            (self.on_error in ("quarantine", "raise"), f"--on-error {self.on_error!r}: choose quarantine or raise"),
            (self.workers is None or self.workers >= 0, f"--workers {self.workers}: give 0 (in-process) or more"),
            (self.executor == "local" or self.executor == "dask" or self.executor.startswith("dask://"),
             f"--executor {self.executor!r}: give local, dask, or dask://HOST:PORT"),
            (self.part is None or 0 <= self.part[0] < self.part[1], f"--part {self.part}: give i/n with 0 <= i < n"),
            (self.decoder in ("cpu", "nvjpeg"), f"--decoder {self.decoder!r}: choose cpu or nvjpeg"),
            (self.decoder == "cpu" or self.encode != "bytes", "--decoder nvjpeg decodes images: it does not apply "
             "to --encode bytes, which stores the files as they are"),
            (self.decoder == "cpu" or self.executor == "local", "--decoder nvjpeg runs on this machine's GPU: "
             "leave --executor out"),
        ]
        for ok, msg in checks:
            if not ok:
                raise FastdataError(msg)
        check_codec(self.codec())
        if parse_size(self.shard_size) < 1:
            raise FastdataError(f"--shard-size {self.shard_size}: give a positive size such as 256MB")

    def codec(self) -> CodecConfig:
        return CodecConfig(self.encode, self.size, self.resize, self.quality)

    def identity(self) -> dict:
        """The settings that determine the bytes of the cache (not workers/progress/paths)."""
        d = asdict(self)
        for k in ("dest", "workers", "progress", "src", "executor", "storage_options", "classes_from"):
            d.pop(k)
        if not d["allow_empty_classes"]:   # absent when off: fingerprints of earlier caches stay valid
            d.pop("allow_empty_classes")
        if d["decoder"] == "cpu":          # likewise; nvjpeg's pixels differ, so its caches say so
            d.pop("decoder")
        d["shard_size"] = parse_size(self.shard_size)
        d["part"] = list(self.part) if self.part else None
        return d


@dataclass(frozen=True)
class BuildResult:
    manifest: Manifest
    written: int          # samples decoded in this run (fewer than total after a resume)
    seconds: float
    resumed_shards: int   # shards already done when this run started
    already_built: bool = False
    skipped: str = ""     # discovery's summary of entries left out of SRC, with reasons
    repaired: tuple[tuple[str, str], ...] = ()   # (shard, problem) rebuilt in a finished cache

    def summary(self) -> str:
        m = self.manifest
        skipped = f"; {self.skipped}" if self.skipped else ""
        if self.already_built:
            return f"{m.num_samples} samples in {len(m.shards)} shards: already built with these settings{skipped}"
        rate = self.written / self.seconds if self.seconds > 0 else 0.0
        total = sum(s.bytes for s in m.shards)
        q = f", {len(m.quarantined)} quarantined (see `fastdata info`)" if m.quarantined else ""
        res = f" (resumed: {self.resumed_shards} shards were done)" if self.resumed_shards else ""
        fixed = "; rebuilt " + ", ".join(f"{n} ({why})" for n, why in self.repaired) if self.repaired else ""
        return (f"{m.num_samples} samples in {len(m.shards)} shards, {human_bytes(total)}; "
                f"{self.written} decoded in {self.seconds:.1f} s = {rate:.0f} img/s{res}{q}{fixed}{skipped}")


def items_per_shard(cfg: BuildConfig, n_items: int) -> int:
    """Inputs per shard: the byte bound divided by an estimate of the stored sample size,
    capped so that big data sets make at least MIN_SHARDS shards. Depends on settings and n only."""
    if cfg.encode == "bytes":
        per_item = 64 * 1024
    else:
        per_item = cfg.size * cfg.size * 3 // (JPEG_RATIO if cfg.encode == "jpeg" else 1)
    by_bytes = max(1, parse_size(cfg.shard_size) // max(1, per_item))
    return max(1, min(by_bytes, max(64, math.ceil(n_items / MIN_SHARDS))))


def _run(cfg: BuildConfig, dest: Path, items: tuple[Item, ...], journal: Journal) -> int:
    """Build every shard the journal lacks; returns the number of samples written."""
    per = items_per_shard(cfg, len(items))
    todo = [k for k in range(math.ceil(len(items) / per)) if k not in journal.shards]
    store = (cfg.dest if is_url(cfg.dest) else None, cfg.storage_options)
    tasks = [(k, items[k * per:(k + 1) * per], cfg.codec(), cfg.format, str(dest), cfg.on_error, store)
             for k in todo]
    workers = min(len(tasks), usable_cpus() if cfg.workers is None else cfg.workers)
    done_before = len(items) - sum(len(t[1]) for t in tasks)
    sizes = {t[0]: len(t[1]) for t in tasks}
    written, finished = 0, done_before
    if cfg.decoder == "nvjpeg":          # this machine's GPU decodes, in the workers or in threads here
        from .gpu_build import gpu_map

        shards = gpu_map(workers)
    else:
        shards = shard_map(cfg.executor, workers)
    with shards as (run, counter), tqdm(
            total=len(items), initial=done_before, unit="img", disable=not cfg.progress,
            desc=f"build {dest.name}", dynamic_ncols=True, smoothing=0.05,
            mininterval=0.1 if sys.stderr.isatty() else 30.0) as bar:   # a log file (Slurm): a line each 30 s
        for index, info, quarantined, error in run(tasks):
            if error:  # the worker's message names the file and the fix
                raise BuildError(error)
            journal.record(index, info, quarantined)
            journal.save(dest)
            written += info.count if info else 0
            finished += sizes[index]   # a cluster's workers share no counter: whole shards move the bar
            bar.update(max(finished, done_before + counter.value) - bar.n)
    return written


def _prepare_dest(cfg: BuildConfig) -> Path:
    """DEST must be missing, empty or a fastdata cache: a build never writes among a user's files
    (it would delete its own strays there, and shard names could clash with theirs)."""
    refuse_url(cfg.dest, "DEST")
    dest = Path(cfg.dest)
    if dest.exists() and not dest.is_dir():
        raise BuildError(f"DEST {dest} is a file; give a folder for the cache")
    if dest.is_dir() and not is_cache_dir(dest):
        try:   # (.build may appear meanwhile: a build started at the same instant is taking the lock)
            foreign = next((p.name for p in dest.iterdir() if p.name != ".build"), None)
        except OSError as e:
            raise BuildError(f"DEST {dest} cannot be listed ({e.strerror}); choose a folder you can write to") from e
        if foreign is not None:
            raise BuildError(f"DEST {dest} is not empty and not a fastdata cache (it holds {foreign!r}, ...); "
                             f"give a new or empty folder, e.g. {dest / 'cache'}")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BuildError(f"DEST {dest} is not writable ({e.strerror}); choose a folder you can write to") from e
    return dest


def _shard_check(cfg: BuildConfig):
    """How a recorded shard is checked: the local file's sha256, or the object's presence and size."""
    if not is_url(cfg.dest):
        return None
    return lambda info: remote_dest.shard_problem(cfg.dest, cfg.storage_options, info)


def _finished(cfg: BuildConfig, dest: Path) -> Manifest | None:
    if is_url(cfg.dest):
        return remote_dest.finished(cfg.dest, cfg.storage_options)
    return load_manifest(dest) if (dest / MANIFEST).exists() else None


def _label_map_of(cfg: BuildConfig) -> dict[str, int]:
    try:
        return load_manifest(user_path(cfg.classes_from), cfg.storage_options).label_map
    except FastdataError as e:
        raise SourceError(f"--classes-from {cfg.classes_from}: {e}") from None


def _identity(cfg: BuildConfig, source, legacy: bool) -> dict:
    """What the cache's bytes depend on: settings, the input list and (unless legacy: a cache made before
    labels were recorded, which reruns keep confirming) each input's class name."""
    identity = {**cfg.identity(), "inputs": len(source.items),
                "inputs_sha256": inputs_digest(it.key for it in source.items)}
    if not legacy:
        identity["labels_sha256"] = labels_digest(source.label_map, (it.label for it in source.items))
    return identity


def _difference(old: dict, new: dict) -> str:
    """'labels (SRC's labels changed since)' / 'settings (size 224, was 256)': what a rerun changed."""
    keys = sorted(k for k in new if k not in ("inputs", "inputs_sha256", "labels_sha256") and old.get(k) != new[k])
    if keys:
        return "settings (" + ", ".join(f"{k} {new[k]}, was {old.get(k)}" for k in keys) + ")"
    if old.get("inputs_sha256") != new["inputs_sha256"]:
        return f"inputs ({new['inputs']} files in SRC now, {old.get('inputs')} then, or other names)"
    return "labels (an input's class, or the classes' numbering, changed since: a relabelled list, --classes-from)"


def _check_finished(cfg, done: Manifest, dest: Path, items, fp: str, identity: dict):
    """A finished cache in DEST: confirm it, or the journal that repairs its missing/damaged shards."""
    if done.build.get("fingerprint") != fp:
        raise BuildError(f"{cfg.dest} already holds a cache built with other {_difference(done.build, identity)}; "
                         f"build into another DEST, or delete this one and build again")
    per = items_per_shard(cfg, len(items))
    shard_of = {it.key: k // per for k, it in enumerate(items)}
    journal, problems = journal_from_manifest(dest, done, fp, shard_of, _shard_check(cfg))
    if not problems:
        return done, None, {}
    for name, why in sorted(problems.items()):
        log.warning("build-cache: %s %s: rebuilding it", dest / name, why)
    return done, journal, problems


def build_cache(cfg: BuildConfig) -> BuildResult:
    """Build (or resume, or confirm, or repair) the cache described by cfg."""
    cfg.validate()
    cfg = replace(cfg, src=user_path(cfg.src), dest=user_path(cfg.dest))
    if cfg.decoder == "nvjpeg":          # before DEST is made
        from .gpu_build import check_gpu_decoder

        check_gpu_decoder()
    source = discover(cfg.src, images_only=cfg.encode != "bytes", exclude=() if is_url(cfg.dest) else (cfg.dest,),
                      allow_empty_classes=cfg.allow_empty_classes, storage_options=cfg.storage_options)
    if cfg.classes_from:   # its map's effect is in the fingerprint (labels_digest), its path is not
        source = with_classes(source, _label_map_of(cfg), cfg.classes_from)
    items = partition(source.items, cfg.part)   # (a bad SRC creates no DEST)
    hint = split_hint(source, cfg.src)
    if hint:
        log.warning("build-cache: %s", hint)
    _warn_upscaling(cfg, items)
    dest = remote_dest.prepare(cfg.dest, cfg.storage_options) if is_url(cfg.dest) else _prepare_dest(cfg)
    with BuildLock(dest):   # taken before anything is written in DEST: concurrent builds cannot race
        done = _finished(cfg, dest)
        identity = _identity(cfg, source, legacy=done is not None and "labels_sha256" not in done.build)
        fp = fingerprint(identity, [it.key for it in items])
        repaired = {}
        if done is not None:
            done, journal, repaired = _check_finished(cfg, done, dest, items, fp, identity)
            if journal is None:
                return BuildResult(done, 0, 0.0, len(done.shards), already_built=True,
                                   skipped=source.skipped_summary())
        else:
            journal = load_journal(dest, fp, _shard_check(cfg))
        clean_strays(dest, {s.name for s in journal.shards.values() if s is not None})
        resumed = len(journal.shards)
        t0 = time.perf_counter()
        written = _run(cfg, dest, items, journal)
        seconds = time.perf_counter() - t0
        manifest = _manifest(cfg, journal, source.label_map, identity, fp)
        if manifest.num_samples == 0:
            _no_samples(dest, manifest)
        if is_url(cfg.dest):
            remote_dest.publish_manifest(cfg.dest, cfg.storage_options, manifest)
        else:
            write_json_atomic(dest / MANIFEST, manifest.to_json())
        journal.remove(dest)
    result = BuildResult(manifest, written, seconds, resumed, skipped=source.skipped_summary(),
                         repaired=tuple(sorted(repaired.items())))
    log.debug("build-cache: %s", result.summary())
    return result


def _warn_upscaling(cfg: BuildConfig, items) -> None:
    """Warn before a build that would mostly upscale (CIFAR's 32 px inputs at the default --size 256):
    32 headers read, local inputs only (object storage would pay a request for each)."""
    if cfg.encode == "bytes" or cfg.resize not in ("fixed", "short") or is_url(cfg.src):
        return
    from .plan import short_sides, upscale_note

    note = upscale_note(short_sides(items), cfg.size)
    if note:
        log.warning("build-cache: %s", note)


def _no_samples(dest: Path, manifest: Manifest) -> None:
    """Every input was quarantined: a build error (an empty cache only fails later, in the loader)."""
    listing = dest / ".build" / "quarantined.txt"
    listing.write_text("".join(f"{q['path']}\t{q['reason']}\n" for q in manifest.quarantined),
                       errors="backslashreplace")
    first = manifest.quarantined[0] if manifest.quarantined else {"path": "?", "reason": "?"}
    raise BuildError(f"no input could be decoded: all {len(manifest.quarantined)} were quarantined (first: "
                     f"{first['path']}: {first['reason']}); the full list is in {listing}; fix the inputs "
                     f"or point SRC at the right folder")


def _manifest(cfg: BuildConfig, journal: Journal, label_map, identity: dict, fp: str) -> Manifest:
    shape = (cfg.size, cfg.size, 3) if cfg.encode != "bytes" and cfg.resize == "fixed" else None
    order = sorted(journal.shards)
    shards = tuple(journal.shards[k] for k in order if journal.shards[k] is not None)
    quarantined = tuple(q for k in order for q in journal.quarantined.get(k, ()))
    return Manifest(kind=cfg.encode, shard_format=cfg.format, num_samples=sum(s.count for s in shards),
                    sample_shape=shape, label_map=label_map, shards=shards, quarantined=quarantined,
                    build={**identity, "fingerprint": fp,
                           **({"storage_options": redact(cfg.storage_options)} if cfg.storage_options else {})})
