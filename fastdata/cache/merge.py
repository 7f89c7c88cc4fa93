"""Join the caches of a partitioned build (--part i/n) into one cache."""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import replace
from pathlib import Path

from .._util import write_json_atomic
from ..errors import BuildError
from .format import MANIFEST, load_manifest, shard_name


def _same(manifests, parts) -> None:
    first = manifests[0]
    for m, p in zip(manifests[1:], parts[1:]):
        for attr in ("kind", "shard_format", "sample_shape", "label_map"):
            if getattr(m, attr) != getattr(first, attr):
                raise BuildError(f"{p}: {attr} differs from {parts[0]}; merge only parts of one build")
        a = {k: v for k, v in m.build.items() if k not in ("part", "fingerprint")}
        b = {k: v for k, v in first.build.items() if k not in ("part", "fingerprint")}
        if a != b:
            raise BuildError(f"{p}: build settings differ from {parts[0]}; merge only parts of one build")


def merge_caches(out: str | Path, parts: list[str | Path]):
    """Hard-link (or copy) each part's shards into out, in part order, with one manifest."""
    out, parts = Path(out), [Path(p) for p in parts]
    if not parts:
        raise BuildError("merge needs at least one part cache")
    manifests = [load_manifest(p) for p in parts]
    _same(manifests, parts)
    if (out / MANIFEST).exists():
        raise BuildError(f"{out} already holds a cache; choose an empty folder")
    out.mkdir(parents=True, exist_ok=True)
    shards, quarantined = [], []
    for part, m in zip(parts, manifests):
        for info in m.shards:
            name = shard_name(len(shards), m.shard_format)
            try:
                os.link(part / info.name, out / name)
            except OSError:
                shutil.copyfile(part / info.name, out / name)
            shards.append(replace(info, name=name))
        quarantined.extend(m.quarantined)
    fp = hashlib.sha256("".join(m.build.get("fingerprint", "") for m in manifests).encode()).hexdigest()
    merged = replace(manifests[0], shards=tuple(shards), quarantined=tuple(quarantined),
                     num_samples=sum(s.count for s in shards),
                     build={**manifests[0].build, "part": None, "fingerprint": fp, "merged_from": len(parts)})
    write_json_atomic(out / MANIFEST, merged.to_json())
    return merged
