"""What a --data path is: a cache, or build input, and how many classes it has."""
from __future__ import annotations

from pathlib import Path

from ..cache.format import MANIFEST, is_manifest, load_manifest


def is_cache(path: str | Path) -> bool:
    """A finished cache: fastdata's manifest.json (format.is_manifest), not another tool's."""
    return is_manifest(Path(path) / MANIFEST)


def num_classes(path: str | Path, storage_options: dict | None = None, allow_empty_classes: bool = False) -> int:
    """Classes of what `fastdata train --data` names, before its loader exists (the model is sized
    first): a cache's label map (local or s3://), else the label map discovery gives a folder, file
    list or tar, the one the loader will use. Counting sub-folders missed file lists and tars (refused
    as "neither a cache nor an image folder") and counted folders discovery leaves out."""
    if str(path).startswith("s3://") or is_cache(path):
        return max(1, len(load_manifest(path, storage_options).label_map))
    from ..cache.sources import discover

    return max(1, len(discover(path, allow_empty_classes=allow_empty_classes).label_map))
