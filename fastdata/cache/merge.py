"""Join the caches of a partitioned build (--part i/n) into one cache.

The parts must be exactly 0..n-1 of one build: the same settings and the same
input list (each part's manifest records the number and digest of all inputs,
not only its slice). They may be given in any order; they are joined in part
order, so the result equals an unpartitioned build's sample order.
"""
from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import replace
from pathlib import Path

from .._util import refuse_url, write_json_atomic
from ..errors import BuildError
from .format import MANIFEST, load_manifest, shard_name
from .sources import is_cache_dir

_PER_PART = ("part", "fingerprint")


def _ordered(manifests, parts):
    """(manifest, path) pairs sorted by part index; refuses anything but parts 0..n-1 of one build."""
    specs = []
    for m, p in zip(manifests, parts):
        part = m.build.get("part")
        if not part:
            raise BuildError(f"{p}: not built with --part i/n; merge joins the parts of one partitioned build")
        specs.append((int(part[0]), int(part[1]), m, p))
    n = specs[0][1]
    first = specs[0]
    for i, k, m, p in specs:
        if k != n:
            raise BuildError(f"{p}: is part {i}/{k} but {first[3]} is part {first[0]}/{n}; merge parts of one build")
        for attr in ("kind", "shard_format", "sample_shape", "label_map"):
            if getattr(m, attr) != getattr(first[2], attr):
                raise BuildError(f"{p}: {attr} differs from {first[3]}; merge only parts of one build")
        a = {key: v for key, v in m.build.items() if key not in _PER_PART}
        b = {key: v for key, v in first[2].build.items() if key not in _PER_PART}
        if a != b:
            raise BuildError(f"{p}: build settings or inputs differ from {first[3]}; merge only parts of one build")
    seen: dict[int, Path] = {}
    for i, _, _, p in specs:
        if i in seen:
            raise BuildError(f"part {i}/{n} given twice ({seen[i]} and {p}); give each part once")
        seen[i] = p
    missing = [str(i) for i in range(n) if i not in seen]
    if missing:
        raise BuildError(f"part(s) {', '.join(missing)} of {n} missing; build them with --part i/{n} and "
                         f"give all {n} parts")
    return [(m, p) for _, _, m, p in sorted(specs, key=lambda s: s[0])]


def merge_caches(out: str | Path, parts: list[str | Path]):
    """Hard-link (or copy) each part's shards into out, in part order, with one manifest."""
    refuse_url(out, "OUT")
    out, parts = Path(out), [Path(p) for p in parts]
    if not parts:
        raise BuildError("merge needs at least one part cache")
    pairs = _ordered([load_manifest(p) for p in parts], parts)
    if (out / MANIFEST).exists():
        raise BuildError(f"{out} already holds a cache; choose an empty folder")
    if out.is_dir() and any(out.iterdir()) and not is_cache_dir(out):
        raise BuildError(f"{out} is not empty; give a new or empty folder for the merged cache")
    out.mkdir(parents=True, exist_ok=True)
    shards, quarantined = [], []
    for m, part in pairs:
        for info in m.shards:
            name = shard_name(len(shards), m.shard_format)
            tmp = out / (name + ".tmp")
            try:
                os.link(part / info.name, tmp)
            except OSError:
                shutil.copyfile(part / info.name, tmp)
            os.replace(tmp, out / name)
            shards.append(replace(info, name=name))
        quarantined.extend(m.quarantined)
    manifests = [m for m, _ in pairs]
    fp = hashlib.sha256("".join(m.build.get("fingerprint", "") for m in manifests).encode()).hexdigest()
    merged = replace(manifests[0], shards=tuple(shards), quarantined=tuple(quarantined),
                     num_samples=sum(s.count for s in shards),
                     build={**manifests[0].build, "part": None, "fingerprint": fp, "merged_from": len(parts)})
    write_json_atomic(out / MANIFEST, merged.to_json())
    return merged
