"""Caches in object storage, against a real S3-protocol server on 127.0.0.1 (moto, no network)."""
from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

import fastdata
from fastdata.cache.format import load_manifest
from fastdata.cli import main
from fastdata.read.dataset import CacheDataset
from fastdata.errors import FastdataError, LoaderError
from fastdata.stores.fetch import RemoteConfig

from helpers import build, check_resume, epoch_indices

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.fixture(scope="module")
def server():
    import s3_server

    srv = s3_server.start()
    yield srv
    srv.proc.kill()
    srv.proc.wait()


@pytest.fixture
def bucket(server, monkeypatch):
    """A fresh bucket, with the server's endpoint and credentials in the environment."""
    import fastdata.stores.s3 as s3

    for k, v in server.env().items():
        monkeypatch.setenv(k, v)
    s3._fs_cache.clear()
    name = f"b-{uuid.uuid4().hex[:10]}"
    server.client().create_bucket(Bucket=name)
    yield name
    s3._fs_cache.clear()


def _remote(tmp_path, limit="3MB"):
    return RemoteConfig(folder=str(tmp_path / "shards"), limit=limit)


def test_build_to_s3_verify_and_read_back_with_resume(image_folder, bucket, tmp_path, capsys):
    url = f"s3://{bucket}/caches/photos"
    src = tmp_path / "list.csv"   # 480 samples: 8 shards of ~0.8 MB, more than the 3 MB folder holds
    src.write_text("".join(f"{p},{k % 10}\n" for k in range(4) for p in sorted(image_folder.rglob("*.jpg"))))
    assert main(["build-cache", str(src), url, "--size", "64", "--shard-size", "1MB", "--workers", "2",
                 "--no-progress"]) == 0
    assert main(["verify", url]) == 0 and "match their checksums" in capsys.readouterr().out
    local = build(src, tmp_path / "local", workers=0)
    m = load_manifest(url)
    assert m.shards == local.manifest.shards and len(m.shards) > 3
    dl = fastdata.loader(url, 16, device="cpu", shuffle=False, remote=_remote(tmp_path))
    ref = CacheDataset(tmp_path / "local")
    for b in dl:
        for i, img in zip(b.indices.tolist(), b.images):
            assert np.array_equal(img.numpy(), ref[i][0].numpy())
    table = dl.backend.cache.gather_table()     # fetched shards joined the one-call gather table
    assert table is not None and dl.backend.cache._table and table.grid is not None
    folder = tmp_path / "shards"
    dl.backend.cache.store.join()
    assert sum(p.stat().st_size for p in folder.iterdir()) <= 3_000_000   # bounded, with eviction
    assert len(list(folder.iterdir())) < len(m.shards)
    assert not list(folder.glob("*.part-*"))
    check_resume(lambda: fastdata.loader(url, 16, device="cpu", seed=3, remote=_remote(tmp_path)), stop_after=3)


def test_src_in_s3_builds_the_same_shards_as_the_local_folder(image_folder, bucket, tmp_path, server):
    client = server.client()
    for p in sorted(image_folder.rglob("*.jpg")):
        client.upload_file(str(p), bucket, f"in/{p.relative_to(image_folder).as_posix()}")
    remote = build(f"s3://{bucket}/in", tmp_path / "from-s3", workers=2)
    local = build(image_folder, tmp_path / "from-disk", workers=2)
    assert remote.manifest.shards == local.manifest.shards and remote.manifest.label_map == local.manifest.label_map


def test_a_fetch_that_fails_mid_shard_is_retried_and_never_published(image_folder, bucket, tmp_path):
    url = f"s3://{bucket}/c"
    build(image_folder, url, workers=0)
    dl = fastdata.loader(url, 16, device="cpu", remote=_remote(tmp_path, "20MB"))
    fs = dl.backend.cache.store.fs
    real, failed = fs.get_file, []

    def flaky(rpath, lpath, **kw):
        if not failed:
            failed.append(rpath)
            with open(lpath, "wb") as f:
                f.write(b"half a shard")
            raise ConnectionError("connection reset mid-transfer")
        return real(rpath, lpath, **kw)
    fs.get_file = flaky
    assert sum(len(b) for b in epoch_indices(dl)) == 120 and failed
    dl.backend.cache.store.join()
    assert not list((tmp_path / "shards").glob("*.part-*"))


def test_a_bucket_that_disappears_is_named(image_folder, bucket, tmp_path, server):
    url = f"s3://{bucket}/c"
    build(image_folder, url, workers=0)
    dl = fastdata.loader(url, 16, device="cpu", remote=_remote(tmp_path, "20MB"))
    client = server.client()
    for obj in client.list_objects_v2(Bucket=bucket)["Contents"]:
        client.delete_object(Bucket=bucket, Key=obj["Key"])
    client.delete_bucket(Bucket=bucket)
    with pytest.raises(LoaderError, match=f"s3://{bucket}/c/shard-\\d+.h5: not found while fetching shard"):
        epoch_indices(dl)


def test_wrong_credentials_are_a_clear_error_without_the_secret(image_folder, bucket, monkeypatch, capsys):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-123")
    import fastdata.stores.s3 as s3

    s3._fs_cache.clear()
    url = f"s3://{bucket}/c"
    assert main(["build-cache", str(image_folder), url, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert f"{url}: access denied" in err and "check the credentials" in err and "not-the-secret-123" not in err
    with pytest.raises(FastdataError, match="access denied"):
        fastdata.loader(url, 8, device="cpu")


def test_secrets_never_reach_the_manifest_or_the_output(image_folder, bucket, server, monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    opts = {"key": server.key, "secret": server.secret, "endpoint_url": server.endpoint}
    url = f"s3://{bucket}/c"
    assert main(["build-cache", str(image_folder), url, "--no-progress", "--storage-options", json.dumps(opts)]) == 0
    assert main(["info", url, "--storage-options", json.dumps(opts)]) == 0
    out = capsys.readouterr()
    manifest = server.client().get_object(Bucket=bucket, Key="c/manifest.json")["Body"].read().decode()
    for text in (manifest, out.out, out.err):
        assert server.secret not in text and server.key not in text
    assert json.loads(manifest)["build"]["storage_options"] == {"key": "***", "secret": "***",
                                                                 "endpoint_url": server.endpoint}


def test_a_foreign_prefix_is_refused(image_folder, bucket, server):
    server.client().put_object(Bucket=bucket, Key="data/notes.txt", Body=b"mine")
    with pytest.raises(FastdataError, match="is not empty and not a fastdata cache"):
        build(image_folder, f"s3://{bucket}/data", workers=0)
