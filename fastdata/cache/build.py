"""build_cache(cfg): decode every input once, in parallel, into checksummed shards.

Order is deterministic: items are sorted, decoded by a process pool with an
ordered imap, and cut into shards by a rule that depends only on the items
(fixed count for fixed-shape raw, else a byte bound). That is what makes
resume exact: the journal says where to restart and the rest follows.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from tqdm import tqdm

from .._util import human_bytes, parse_size, usable_cpus, write_json_atomic
from ..errors import BuildError, FastdataError
from .codecs import ENCODINGS, RESIZE_MODES, CodecConfig, process_file
from .format import MANIFEST, SHARD_FORMATS, Manifest, load_manifest, shard_name
from .journal import BUILD_DIR, BuildLock, Journal, clean_strays, fingerprint, load_journal
from .sources import discover, partition
from .writers import WRITERS

log = logging.getLogger("fastdata.build")


@dataclass(frozen=True)
class BuildConfig:
    src: str
    dest: str
    format: str = "h5"             # h5 | pt
    encode: str = "raw"            # raw | jpeg | bytes
    size: int = 256
    resize: str = "fixed"          # fixed | short | max | none
    quality: int = 90
    shard_size: str | int = "256MB"
    workers: int | None = None     # None: every usable CPU
    on_error: str = "quarantine"   # quarantine | raise
    part: tuple[int, int] | None = None
    progress: bool = True

    def validate(self) -> None:
        checks = [
            (self.format in SHARD_FORMATS, f"--format {self.format!r}: choose one of {', '.join(SHARD_FORMATS)}"),
            (self.encode in ENCODINGS, f"--encode {self.encode!r}: choose one of {', '.join(ENCODINGS)}"),
            (self.resize in RESIZE_MODES, f"--resize {self.resize!r}: choose one of {', '.join(RESIZE_MODES)}"),
            (self.on_error in ("quarantine", "raise"), f"--on-error {self.on_error!r}: choose quarantine or raise"),
            (isinstance(self.size, int) and 1 <= self.size <= 16384, f"--size {self.size}: give 1..16384 pixels"),
            (1 <= self.quality <= 100, f"--quality {self.quality}: give 1..100"),
            (self.workers is None or self.workers >= 0, f"--workers {self.workers}: give 0 (in-process) or more"),
            (self.part is None or 0 <= self.part[0] < self.part[1], f"--part {self.part}: give i/n with 0 <= i < n"),
        ]
        for ok, msg in checks:
            if not ok:
                raise FastdataError(msg)
        if parse_size(self.shard_size) < 1:
            raise FastdataError(f"--shard-size {self.shard_size}: give a positive size such as 256MB")

    def codec(self) -> CodecConfig:
        return CodecConfig(self.encode, self.size, self.resize, self.quality)

    def identity(self) -> dict:
        """The settings that determine the bytes of the cache (not workers/progress)."""
        d = asdict(self)
        for k in ("dest", "workers", "progress", "src"):
            d.pop(k)
        d["shard_size"] = parse_size(self.shard_size)
        d["part"] = list(self.part) if self.part else None
        return d


@dataclass(frozen=True)
class BuildResult:
    manifest: Manifest
    written: int          # samples decoded in this run (less than total after a resume)
    seconds: float
    resumed_from: int     # item index the run started at

    def summary(self) -> str:
        m = self.manifest
        rate = self.written / self.seconds if self.seconds > 0 else 0.0
        total = sum(s.bytes for s in m.shards)
        q = f", {len(m.quarantined)} quarantined (see `fastdata info`)" if m.quarantined else ""
        res = f" (resumed at item {self.resumed_from})" if self.resumed_from else ""
        return (f"{m.num_samples} samples in {len(m.shards)} shards, {human_bytes(total)}; "
                f"{self.written} decoded in {self.seconds:.1f} s = {rate:.0f} img/s{res}{q}")


def _samples_per_shard(cfg: BuildConfig) -> int | None:
    """Fixed-shape raw shards hold an exact count; other kinds are cut by bytes."""
    if cfg.encode == "raw" and cfg.resize == "fixed":
        return max(1, parse_size(cfg.shard_size) // (cfg.size * cfg.size * 3))
    return None


def _results(cfg: BuildConfig, paths: list[str]):
    """Ordered decode results; a pool over usable CPUs unless workers == 0."""
    fn = partial(process_file, cfg=cfg.codec())
    workers = usable_cpus() if cfg.workers is None else cfg.workers
    if workers == 0 or len(paths) < 2:
        yield from map(fn, paths)
        return
    # forkserver: workers never inherit the writer's open files or threads
    with mp.get_context("forkserver").Pool(workers) as pool:
        yield from pool.imap(fn, paths, chunksize=8)


def _prepare_dest(cfg: BuildConfig) -> Path:
    dest = Path(cfg.dest)
    if dest.exists() and not dest.is_dir():
        raise BuildError(f"DEST {dest} is a file; give a folder for the cache")
    try:
        dest.mkdir(parents=True, exist_ok=True)
        probe = dest / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise BuildError(f"DEST {dest} is not writable ({e.strerror}); choose a folder you can write to") from e
    return dest


def build_cache(cfg: BuildConfig) -> BuildResult:
    """Build (or resume, or confirm) the cache described by cfg."""
    cfg.validate()
    dest = _prepare_dest(cfg)
    with BuildLock(dest):
        source = discover(cfg.src, images_only=cfg.encode != "bytes")
        items = partition(source.items, cfg.part)
        identity = cfg.identity()
        fp = fingerprint(identity, [it.key for it in items])
        if (dest / MANIFEST).exists():
            done = load_manifest(dest)
            if done.build.get("fingerprint") != fp:
                raise BuildError(f"{dest} already holds a cache built with other settings or inputs; "
                                 f"choose another DEST or delete this one")
            return BuildResult(done, 0, 0.0, len(items))
        journal = load_journal(dest, fp)
        clean_strays(dest, {s.name for s in journal.shards})
        start = journal.next_item
        t0 = time.perf_counter()
        _run(cfg, dest, items, journal, source.label_map)
        seconds = time.perf_counter() - t0
        manifest = _manifest(cfg, journal, source.label_map, identity, fp)
        write_json_atomic(dest / MANIFEST, manifest.to_json())
        (dest / BUILD_DIR / "journal.json").unlink(missing_ok=True)
    result = BuildResult(manifest, len(items) - start - _quarantined_since(journal, start), seconds, start)
    log.info("build-cache: %s", result.summary())
    return result


def _quarantined_since(journal: Journal, start: int) -> int:
    return sum(1 for q in journal.quarantined if q["item"] >= start)


def _run(cfg: BuildConfig, dest: Path, items, journal: Journal, label_map) -> None:
    per_shard = _samples_per_shard(cfg)
    max_bytes = parse_size(cfg.shard_size)
    writer_cls = WRITERS[cfg.format]
    todo = items[journal.next_item:]
    pending_q: list[dict] = []
    writer = None
    bar = tqdm(total=len(items), initial=journal.next_item, unit="img", disable=not cfg.progress,
               desc=f"build {dest.name}", dynamic_ncols=True, smoothing=0.05)
    try:
        base = journal.next_item
        for offset, (item, res) in enumerate(zip(todo, _results(cfg, [it.path for it in todo]))):
            cur = base + offset
            bar.update(1)
            if isinstance(res, str):
                if cfg.on_error == "raise":
                    raise BuildError(f"{item.path}: {res}; fix or remove the file, or rerun with --on-error quarantine "
                                     f"(finished shards are kept and the rerun resumes)")
                pending_q.append({"item": cur, "path": item.key, "reason": res})
                continue
            payload, shape, crc = res
            if writer is not None and (writer.count == per_shard or
                                       (per_shard is None and writer.nbytes + len(payload) > max_bytes)):
                _flush(writer, journal, pending_q, cur, dest)
                writer = None
            if writer is None:
                writer = writer_cls(dest / shard_name(len(journal.shards), cfg.format))
            writer.add(payload, item.label, shape, crc, item.key)
        if writer is not None or pending_q:
            _flush(writer, journal, pending_q, len(items), dest)
    finally:
        bar.close()


def _flush(writer, journal: Journal, pending_q: list[dict], next_item: int, dest: Path) -> None:
    """Commit a finished shard and the quarantines before next_item to the journal."""
    if writer is not None:
        journal.shards.append(writer.close())
    journal.quarantined.extend(pending_q)
    pending_q.clear()
    journal.next_item = next_item
    journal.save(dest)


def _manifest(cfg: BuildConfig, journal: Journal, label_map, identity: dict, fp: str) -> Manifest:
    shape = (cfg.size, cfg.size, 3) if cfg.encode != "bytes" and cfg.resize == "fixed" else None
    return Manifest(
        kind=cfg.encode, shard_format=cfg.format, num_samples=sum(s.count for s in journal.shards),
        sample_shape=shape, label_map=label_map, shards=tuple(journal.shards),
        quarantined=tuple({"path": q["path"], "reason": q["reason"]} for q in journal.quarantined),
        build={**identity, "fingerprint": fp})
