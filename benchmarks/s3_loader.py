"""fastdata.loader from an S3 server on loopback (moto) against the same cache in a local folder.

    python benchmarks/s3_loader.py [--per-class 100] [--size 224] [--seconds 5]

Rows, in one run: local folder; s3 cold (empty shard folder: every shard fetched ahead of the
sample order); s3 warm (second pass over the now-filled folder, as a restarted job sees it); then
local and warm again. "x local" is against the mean of the two local rows.
All read the same raw cache with the same loader settings to host memory (CPU box) or the GPU.
"""
from __future__ import annotations

import sys
import tempfile
import time
import uuid
from pathlib import Path

from _common import ROOT, data_args, drain, write

sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    import os

    import torch

    import fastdata
    import s3_server
    from fastdata.cache.build import BuildConfig, build_cache
    from fastdata.sample import make_image_folder
    from fastdata.stores.fetch import RemoteConfig

    ap = data_args()
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fastdata-s3-"))
    srv = s3_server.start()
    try:
        os.environ.update(srv.env())
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        srv.client().create_bucket(Bucket=bucket)
        src = make_image_folder(work / "src", a.per_class)
        local = build_cache(BuildConfig(src=str(src), dest=str(work / "local"), size=a.size, progress=False))
        url = f"s3://{bucket}/cache"
        t0 = time.perf_counter()
        build_cache(BuildConfig(src=str(src), dest=url, size=a.size, progress=False))
        upload_s = time.perf_counter() - t0
        device = "cuda" if torch.cuda.is_available() else "cpu"
        remote = RemoteConfig(folder=str(work / "shards"), limit="64GB")
        rows = []
        order = (("local folder", str(work / "local")), ("s3 cold", url), ("s3 warm", url),
                 ("local folder, again", str(work / "local")), ("s3 warm, again", url))
        for name, target in order:
            dl = fastdata.loader(target, a.batch_size, device=device, remote=remote if target == url else None)
            rows.append({"row": name, "img/s": drain(dl, a.seconds)})
            dl.close()
        local_rate = (rows[0]["img/s"] + rows[3]["img/s"]) / 2     # the two local rows bracket the warm ones
        for r in rows:
            r["x local"] = r["img/s"] / local_rate
        size_mb = sum(s.bytes for s in local.manifest.shards) / 1e6
        notes = (f"{local.manifest.num_samples} images at {a.size} px raw, {len(local.manifest.shards)} shards, "
                 f"{size_mb:,.0f} MB; moto S3 server on 127.0.0.1; device {device}; build to s3 took {upload_s:.1f} s."
                 f"\n\nRerun: `python benchmarks/s3_loader.py --per-class {a.per_class} --size {a.size} "
                 f"--seconds {a.seconds}`")
        write("s3-loader", rows, ["row", "img/s", "x local"], notes)
    finally:
        srv.proc.kill()


if __name__ == "__main__":
    main()
