"""Checksums: whole-shard sha256 from the manifest, then per-sample crc32 to name the damage."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .._util import file_sha256
from ..errors import CacheFormatError, FastdataError
from .format import load_manifest


@dataclass
class VerifyReport:
    cache: Path
    shards: int = 0
    damaged: dict[str, str] = field(default_factory=dict)          # shard -> what is wrong
    samples: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # shard -> [(index, key)]

    @property
    def ok(self) -> bool:
        return not self.damaged

    def text(self) -> str:
        if self.ok:
            return f"{self.cache}: all {self.shards} shards match their checksums"
        lines = [f"{self.cache}: {len(self.damaged)} of {self.shards} shards damaged; rebuild them "
                 f"(rerun the build-cache command that made it: it rebuilds only these)"]
        for name, why in sorted(self.damaged.items()):
            lines.append(f"  {name}: {why}")
            for idx, key in self.samples.get(name, [])[:20]:
                lines.append(f"    sample {idx} ({key})")
        return "\n".join(lines)


def _damaged_samples(path: Path, start: int) -> tuple[str, list[tuple[int, str]]]:
    from .shardfile import open_shard

    try:
        shard = open_shard(path)
    except CacheFormatError as e:
        return f"unreadable: {e}", []
    bad = [(start + j, shard.keys[j]) for j in shard.failing_crc()]
    why = f"sha256 mismatch; {len(bad)} samples fail their crc32" if bad else \
        ("sha256 mismatch, every sample's crc32 intact: its metadata is damaged, or it is another file (a copy "
         "of another shard?)")
    return why, bad


def _verify_remote(url: str, m, storage_options: dict | None) -> VerifyReport:
    """Fetch every shard through a bounded folder: each fetch checks size and sha256 (stores/fetch.py)."""
    from ..stores.fetch import RemoteConfig, RemoteShards

    report = VerifyReport(url, len(m.shards))
    shards = RemoteShards(url, m.shards, RemoteConfig(storage_options=storage_options))
    try:
        for i, info in enumerate(m.shards):
            try:
                shards.get(i)
                shards.release(i)
            except FastdataError as e:
                report.damaged[info.name] = str(e)
    finally:
        shards.close()
    return report


def verify_cache(path: str | Path, storage_options: dict | None = None) -> VerifyReport:
    m = load_manifest(path, storage_options)
    if str(path).startswith("s3://"):
        return _verify_remote(str(path), m, storage_options)
    path = Path(path)
    report = VerifyReport(path, len(m.shards))
    start = 0
    for info in m.shards:
        p = path / info.name
        if not p.is_file():
            report.damaged[info.name] = "missing"
        elif p.stat().st_size != info.bytes:
            report.damaged[info.name] = f"size {p.stat().st_size} B, manifest says {info.bytes} B (truncated?)"
        elif file_sha256(p) != info.sha256:
            why, bad = _damaged_samples(p, start)
            report.damaged[info.name] = why
            report.samples[info.name] = bad
        start += info.count
    return report
