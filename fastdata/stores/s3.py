"""S3 access for builds and readers: one filesystem per (options) per process, clear errors, redaction.

Endpoint and credentials come from the usual environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, AWS_PROFILE) or from storage options (`--storage-options
'{"endpoint_url": "http://minio:9000", "key": "...", "secret": "..."}'`). Secrets never reach a
manifest, a log line or an error message: options are recorded through ``redact``.
"""
from __future__ import annotations

import json
import os
import re
import threading

from ..errors import DependencyError, FastdataError

SCHEMES = ("s3",)
_SECRET = re.compile(r"key|secret|token|password|passwd|credential|signature|auth", re.IGNORECASE)
_fs_cache: dict[tuple[int, str], object] = {}
_lock = threading.Lock()


def is_url(text) -> bool:
    return str(text).startswith("s3://")


def join(url: str, name: str) -> str:
    return url.rstrip("/") + "/" + name


def parse_options(text: str | None) -> dict:
    """--storage-options: a JSON object (or empty)."""
    if not text:
        return {}
    try:
        opts = json.loads(text)
    except json.JSONDecodeError as e:
        raise FastdataError(f"--storage-options: not JSON ({e.msg}); give an object such as "
                            f"'{{\"endpoint_url\": \"http://host:9000\"}}'") from None
    if not isinstance(opts, dict):
        raise FastdataError("--storage-options: give a JSON object, e.g. '{\"endpoint_url\": \"http://host:9000\"}'")
    return opts


def redact(value):
    """A copy of storage options with every secret-looking value replaced by '***'."""
    if isinstance(value, dict):
        return {k: ("***" if _SECRET.search(str(k)) and not str(k).endswith("url") else redact(v))
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v) for v in value]
    return value


def filesystem(options: dict | None = None):
    """An s3fs filesystem for these options (cached per process: workers make their own after fork)."""
    try:
        import s3fs
    except ImportError:
        raise DependencyError("s3:// paths need s3fs: pip install 'fastdata[s3]'") from None
    opts = dict(options or {})
    endpoint = opts.pop("endpoint_url", None) or os.environ.get("AWS_ENDPOINT_URL_S3") or \
        os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        opts.setdefault("client_kwargs", {})["endpoint_url"] = endpoint
    key = (os.getpid(), json.dumps(opts, sort_keys=True, default=str))
    with _lock:
        if key not in _fs_cache:
            _fs_cache[key] = s3fs.S3FileSystem(skip_instance_cache=True, **opts)
        return _fs_cache[key]


def strip(url: str) -> str:
    return url[len("s3://"):].rstrip("/")


def storage_error(e: BaseException, url: str, doing: str) -> FastdataError:
    """What went wrong with url, and what to do; never the credentials."""
    text = str(e) or type(e).__name__
    if isinstance(e, PermissionError) or "AccessDenied" in text or "Forbidden" in text or "InvalidAccessKeyId" in text \
            or "SignatureDoesNotMatch" in text or "does not exist in our records" in text \
            or "NoCredentials" in type(e).__name__ or "Unable to locate credentials" in text:
        return FastdataError(f"{url}: access denied while {doing} ({_clean(text)}); check the credentials "
                             f"(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or --storage-options "
                             f"key/secret) and that they may read and write this bucket")
    if isinstance(e, FileNotFoundError) or "NoSuchBucket" in text or "does not exist" in text:
        return FastdataError(f"{url}: not found while {doing} ({_clean(text)}); check the bucket and prefix, "
                             f"or whether they were deleted")
    return FastdataError(f"{url}: storage error while {doing} ({type(e).__name__}: {_clean(text)}); check the "
                         f"endpoint (AWS_ENDPOINT_URL or --storage-options endpoint_url) and the network, then rerun")


def _clean(text: str) -> str:
    """The first line of a storage error, short: botocore's messages name no secret there."""
    return text.splitlines()[0][:200] if text else "no detail"
