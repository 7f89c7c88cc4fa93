"""What a --data path is: a cache, or build input, and how many classes it has."""
from __future__ import annotations

from pathlib import Path

from ..cache.format import MANIFEST, load_manifest
from ..errors import FastdataError

def is_cache(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def num_classes(path: str | Path) -> int:
    if is_cache(path):
        return max(1, len(load_manifest(path).label_map))
    p = Path(path)
    if p.is_dir():
        return max(1, sum(1 for d in p.iterdir() if d.is_dir() and not d.name.startswith(".")))
    raise FastdataError(f"--data {path}: neither a fastdata cache nor an image folder")
