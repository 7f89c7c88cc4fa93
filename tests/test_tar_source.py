"""WebDataset-style tar sources: built end to end without extraction; hostile members never followed."""
from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np

from fastdata.cache.codecs import CodecConfig, decode
from fastdata.read.dataset import CacheDataset

from helpers import build


def _add(tf: tarfile.TarFile, name: str, data: bytes, **kw) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in kw.items():
        setattr(info, k, v)
    tf.addfile(info, io.BytesIO(data))


def _photos(image_folder: Path, n: int) -> list[Path]:
    return sorted(image_folder.rglob("*.jpg"))[:n]


def test_webdataset_tar_builds_like_the_files(image_folder, tmp_path):
    photos = _photos(image_folder, 12)
    tar = tmp_path / "shard-000.tar"
    with tarfile.open(tar, "w") as tf:
        for k, p in enumerate(photos):
            _add(tf, f"s/{k:04d}.jpg", p.read_bytes())
            _add(tf, f"s/{k:04d}.cls", str(10 * (k % 3)).encode())
        _add(tf, "s/readme.txt", b"not a sample")
    res = build(tar, tmp_path / "c", workers=0)
    m = res.manifest
    assert m.num_samples == 12 and m.label_map == {"0": 0, "10": 1, "20": 2}
    ds = CacheDataset(tmp_path / "c")
    keys = ds.cache.shard(0).keys
    assert keys[:2] == ["shard-000.tar/s/0000.jpg", "shard-000.tar/s/0001.jpg"]
    for i in (0, 5, 11):
        img, label = ds[i]
        assert np.array_equal(img.numpy(), np.asarray(decode(photos[i].read_bytes(), CodecConfig(size=64))))
        assert label == i % 3
    assert "1 not an image or label member" in res.skipped


def test_folder_of_tars_with_class_folders_inside(image_folder, tmp_path):
    src = tmp_path / "tars"
    src.mkdir()
    photos = _photos(image_folder, 8)
    for t in range(2):
        with tarfile.open(src / f"part-{t}.tar", "w") as tf:
            for k, p in enumerate(photos[4 * t:4 * t + 4]):
                _add(tf, f"{'cat' if k % 2 else 'dog'}/{t}-{k}.jpg", p.read_bytes())
    m = build(src, tmp_path / "c", workers=0).manifest
    assert m.num_samples == 8 and m.label_map == {"cat": 0, "dog": 1}


def test_hostile_members_are_quarantined_and_nothing_is_written_outside_dest(image_folder, tmp_path):
    photo = _photos(image_folder, 1)[0].read_bytes()
    work = tmp_path / "work"
    work.mkdir()
    tar = work / "evil.tar"
    with tarfile.open(tar, "w") as tf:
        _add(tf, "ok/0001.jpg", photo)
        _add(tf, "../evil.jpg", photo)
        _add(tf, "/tmp/abs-evil.jpg", photo)
        _add(tf, "ok/link.jpg", b"", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        _add(tf, "ok/hard.jpg", b"", type=tarfile.LNKTYPE, linkname="ok/0001.jpg")
    before = set(tmp_path.rglob("*")) | set(Path("/tmp").glob("abs-evil*"))
    dest = work / "c"
    m = build(tar, dest, workers=0).manifest
    assert m.num_samples == 1
    reasons = {q["path"]: q["reason"] for q in m.quarantined}
    assert set(reasons) == {"evil.tar/../evil.jpg", "evil.tar/tmp/abs-evil.jpg", "evil.tar/ok/link.jpg",
                            "evil.tar/ok/hard.jpg"}
    assert "unsafe member name" in reasons["evil.tar/../evil.jpg"]
    assert "unsafe member name" in reasons["evil.tar/tmp/abs-evil.jpg"]
    assert "link member, not followed" in reasons["evil.tar/ok/link.jpg"]
    after = set(tmp_path.rglob("*")) | set(Path("/tmp").glob("abs-evil*"))
    assert {p for p in after - before if p != dest and dest not in p.parents} == set()
    assert not (tmp_path / "evil.jpg").exists() and not os.path.exists("/tmp/abs-evil.jpg")


def test_a_sample_without_its_label_is_quarantined_not_made_class_0(image_folder, tmp_path, caplog):
    """In a labelled tar, a sample missing its .cls became class "0" beside the real class 0; WebDataset
    .json metadata labels were skipped (and those samples made class 0 too)."""
    import fastdata

    photos = _photos(image_folder, 8)
    tar = tmp_path / "shard-000.tar"
    with tarfile.open(tar, "w") as tf:
        for k in range(6):
            _add(tf, f"{k:04d}.jpg", photos[k].read_bytes())
            if k == 4:
                _add(tf, f"{k:04d}.json", b'{"label": 2, "caption": "a photo"}')
            elif k != 3:
                _add(tf, f"{k:04d}.cls", str(k % 3).encode())
        _add(tf, "0006.jpg", photos[6].read_bytes())
        _add(tf, "0006.cls", b"x" * 100)                  # not a label: too long
    res = build(tar, tmp_path / "c", workers=0)
    assert sorted(q["path"].rsplit("/", 1)[-1] for q in res.manifest.quarantined) == ["0003.jpg", "0006.jpg"]
    assert "not guessed" in res.manifest.quarantined[0]["reason"]
    labels = {k.rsplit("/", 1)[-1]: int(lab) for k, lab in zip(CacheDataset(tmp_path / "c").cache.shard(0).keys,
                                                           CacheDataset(tmp_path / "c").cache.labels())}
    assert labels == {"0000.jpg": 0, "0001.jpg": 1, "0002.jpg": 2, "0004.jpg": 2, "0005.jpg": 2}
    dl = fastdata.loader(tar, 2, backend="pil", device="cpu", shuffle=False)   # read in place: left out, warned
    assert sorted(int(y) for _, ys in dl for y in ys) == [0, 1, 2, 2, 2]
    assert "2 input(s) left out" in caplog.text
