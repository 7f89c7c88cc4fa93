"""Building into object storage (DEST = s3://bucket/prefix).

The build's bookkeeping stays local, in a staging folder keyed by the URL
(``$FASTDATA_STAGING`` or ``~/.cache/fastdata/staging/<digest>``): the lock and the journal live
there, so the same command resumes after a kill, as a local build does. Shards are written there
by the jobs, uploaded by the same job as soon as they are finished (one PUT each, which readers see
whole or not at all) and deleted locally, so the staging folder never holds more than the shards
in flight. The manifest is uploaded last: a prefix without ``manifest.json`` is an unfinished cache.

A prefix that holds objects but no fastdata cache is refused, as a local DEST is; a marker object
``.build/owner`` is written before the first shard. (S3 has no cross-machine lock: two machines
building into one prefix at once are not detected; one machine's builds are, by the local lock.)
"""
from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path

from ..errors import BuildError
from ..stores.s3 import filesystem, join, storage_error, strip
from .format import MANIFEST, Manifest, ShardInfo


def staging_dir(url: str) -> Path:
    root = Path(os.environ.get("FASTDATA_STAGING", Path.home() / ".cache" / "fastdata" / "staging"))
    return root / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:16]


def prepare(url: str, options: dict | None) -> Path:
    """Refuse a foreign non-empty prefix, mark it as ours, return the local staging folder."""
    fs, root = filesystem(options), strip(url)
    try:
        names = [k[len(root) + 1:] for k in fs.find(root) if k.startswith(root + "/")]
    except Exception as e:  # noqa: BLE001
        raise BuildError(str(storage_error(e, url, "listing DEST"))) from None
    ours = MANIFEST in names or ".build/owner" in names
    if names and not ours:
        raise BuildError(f"DEST {url} is not empty and not a fastdata cache (it holds {names[0]!r}, ...); give "
                         f"a new or empty prefix, e.g. {join(url, 'cache')}")
    if not ours:
        owner = {"host": socket.gethostname(), "pid": os.getpid()}
        try:
            fs.pipe_file(strip(join(url, ".build/owner")), json.dumps(owner).encode())
        except Exception as e:  # noqa: BLE001
            raise BuildError(str(storage_error(e, url, "writing to DEST"))) from None
    local = staging_dir(url)
    local.mkdir(parents=True, exist_ok=True)
    return local


def finished(url: str, options: dict | None) -> Manifest | None:
    from ..stores.fetch import fetch_manifest

    fs = filesystem(options)
    try:
        if not fs.exists(strip(join(url, MANIFEST))):
            return None
    except Exception as e:  # noqa: BLE001
        raise BuildError(str(storage_error(e, url, "reading DEST"))) from None
    return Manifest.from_json(fetch_manifest(url, options), join(url, MANIFEST))


def shard_problem(url: str, options: dict | None, info: ShardInfo) -> str | None:
    """Missing or resized shard objects (their sha256 is checked by readers as they fetch them)."""
    try:
        size = filesystem(options).info(strip(join(url, info.name)))["size"]
    except FileNotFoundError:
        return "missing"
    except Exception as e:  # noqa: BLE001
        raise BuildError(str(storage_error(e, url, "checking shards"))) from None
    return None if size == info.bytes else f"size {size} B, manifest says {info.bytes} B"


def publish_manifest(url: str, options: dict | None, manifest: Manifest) -> None:
    data = json.dumps(manifest.to_json(), indent=1, sort_keys=True).encode()
    try:
        filesystem(options).pipe_file(strip(join(url, MANIFEST)), data)
    except Exception as e:  # noqa: BLE001
        raise BuildError(str(storage_error(e, url, "uploading the manifest"))) from None
