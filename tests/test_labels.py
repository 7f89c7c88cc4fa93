"""Labels and what a folder or list means (classes, splits, relabelled lists, other tools' files): each
test failed before its fix."""
from __future__ import annotations

import shutil

import pytest

from fastdata.cli import main
from fastdata.errors import SourceError
from fastdata.read.dataset import CacheDataset

from helpers import build
from test_messy_sources import _tree


def test_a_line_without_a_label_among_labelled_ones_is_refused_not_made_class_0(image_folder, tmp_path):
    photos = sorted(image_folder.rglob("*.jpg"))[:3]
    lst = tmp_path / "list.csv"
    lst.write_text(f"path,label\n{photos[0]},cat\n{photos[1]}\n{photos[2]},dog\n")
    with pytest.raises(SourceError, match="line 3 has no label but other lines do"):
        build(lst, tmp_path / "c", workers=0)
    lst.write_text("".join(f"{p}\n" for p in photos))   # no labels at all: one class
    assert build(lst, tmp_path / "c", workers=0).manifest.label_map == {"0": 0}


def test_a_rerun_after_a_list_is_relabelled_is_refused_naming_the_labels(image_folder, tmp_path, capsys):
    """The fingerprint covered paths and settings only, so after a mislabelled image was fixed in the CSV
    the rerun said 'already built' and the cache kept the old labels."""
    photos = sorted(image_folder.rglob("*.jpg"))[:2]
    lst, dest = tmp_path / "list.csv", tmp_path / "c"
    lst.write_text(f"{photos[0]},cat\n{photos[1]},dog\n")
    argv = ["build-cache", str(lst), str(dest), "--no-progress", "--size", "32"]
    assert main(argv) == 0 and main(argv) == 0 and "already built" in capsys.readouterr().out
    lst.write_text(f"{photos[0]},dog\n{photos[1]},cat\n")
    assert main(argv) == 2
    assert "built with other labels" in capsys.readouterr().err
    assert CacheDataset(dest).cache.labels().tolist() == [0, 1]   # left as it was
    assert main(argv[:-1] + ["48"]) == 2 and "size 48, was 32" in capsys.readouterr().err


def test_a_cache_from_before_labels_were_recorded_is_still_confirmed_by_a_rerun(image_folder, tmp_path,
                                                                                  monkeypatch):
    from fastdata.cache import build as build_mod

    photos = sorted(image_folder.rglob("*.jpg"))[:2]
    lst, dest = tmp_path / "list.csv", tmp_path / "c"
    lst.write_text(f"{photos[0]},cat\n{photos[1]},dog\n")
    real = build_mod._identity
    monkeypatch.setattr(build_mod, "_identity", lambda cfg, source, legacy: real(cfg, source, True))
    build(lst, dest, workers=0)
    assert "labels_sha256" not in build_mod.load_manifest(dest).build
    monkeypatch.setattr(build_mod, "_identity", real)
    assert build(lst, dest, workers=0).already_built


def test_classes_from_numbers_a_validation_set_as_its_training_cache(image_folder, tmp_path, capsys):
    """A validation folder without class b would number c as 1 where the training cache has 2;
    --classes-from TRAIN takes the training cache's numbering, and a class it lacks is refused."""
    train = build(_tree(image_folder, tmp_path / "train"), tmp_path / "tc", workers=0)
    val = _tree(image_folder, tmp_path / "val", classes=("a", "c"), per_class=2)
    argv = ["build-cache", str(val), str(tmp_path / "vc"), "--no-progress", "--size", "32"]
    assert main(argv + ["--classes-from", str(tmp_path / "tc")]) == 0
    assert CacheDataset(tmp_path / "vc").cache.labels().tolist() == [0, 0, 2, 2]
    assert CacheDataset(tmp_path / "vc").cache.manifest.label_map == train.manifest.label_map
    capsys.readouterr()
    assert main(["info", str(tmp_path / "vc")]) == 0 and "labels: 0 a, 1 b, 2 c\n" in capsys.readouterr().out
    assert main(argv) == 2 and "built with other labels" in capsys.readouterr().err   # numbering differs
    (val / "d").mkdir()
    shutil.copyfile(next(val.rglob("*.jpg")), val / "d" / "x.jpg")
    assert main(["build-cache", str(val), str(tmp_path / "v2"), "--classes-from", str(tmp_path / "tc")]) == 2
    assert "SRC has class(es) 'd' that" in capsys.readouterr().err and not (tmp_path / "v2").exists()
    assert main(["build-cache", str(val), str(tmp_path / "v3"), "--classes-from", str(val)]) == 2
    assert f"--classes-from {val}: " in capsys.readouterr().err


def test_a_class_folder_holding_another_tools_manifest_json_is_a_class_not_a_cache(image_folder, tmp_path):
    """A labelling export's manifest.json inside class 'a' made discovery skip the folder as a fastdata
    cache: its images were lost and b, c became classes 0, 1. A truncated manifest of ours (shards beside
    it) is still a cache, never an input."""
    src = _tree(image_folder, tmp_path / "src")
    (src / "a" / "manifest.json").write_text('{"tool": "label-studio", "tasks": 3}')
    m = build(src, tmp_path / "c", workers=0).manifest
    assert m.label_map == {"a": 0, "b": 1, "c": 2} and m.num_samples == 9
    inner = src / "b" / "old-cache"
    shutil.copytree(tmp_path / "c", inner)
    (inner / "manifest.json").write_text((inner / "manifest.json").read_text()[:40])   # damaged, still ours
    again = build(src, tmp_path / "c2", workers=0)
    assert again.manifest.num_samples == 9 and "1 a fastdata cache" in again.skipped


def test_a_path_with_a_comma_in_a_whitespace_separated_list_and_lists_without_entries(image_folder, tmp_path):
    """`we,ird/a b.jpg cat` was split at the comma, its 'we' taken for a header, and the build said 'no
    image files found; expected class sub-folders'."""
    odd = tmp_path / "we,ird" / "a b.jpg"
    odd.parent.mkdir()
    shutil.copyfile(sorted(image_folder.rglob("*.jpg"))[0], odd)
    lst = tmp_path / "list.txt"
    lst.write_text("we,ird/a b.jpg cat\n")
    m = build(lst, tmp_path / "c", workers=0).manifest
    assert m.num_samples == 1 and m.label_map == {"cat": 0}
    lst.write_text('path,label\n"we,ird/a b.jpg",cat\n')   # the same in CSV, quoted
    assert build(lst, tmp_path / "c2", workers=0).manifest.label_map == {"cat": 0}
    for text, needle in (("# nothing yet\n", "no entries"), ("path,label\n", "line 1 is a header")):
        lst.write_text(text)
        with pytest.raises(SourceError, match=needle):
            build(lst, tmp_path / "c3", workers=0)


def test_split_folders_given_as_src_are_warned_about(image_folder, tmp_path, caplog):
    """imagenet/ holding train/ and val/ builds two classes, 'train' and 'val' (as ImageFolder would):
    the build says so, naming the folder to build instead; real classes are not warned about."""
    root = tmp_path / "imagenet"
    _tree(image_folder, root / "train")
    _tree(image_folder, root / "val", per_class=1)
    m = build(root, tmp_path / "c", workers=0).manifest
    assert m.label_map == {"train": 0, "val": 1}
    assert f"build each split on its own (SRC {root / 'train'})" in caplog.text
    caplog.clear()
    build(root / "train", tmp_path / "c2", workers=0)
    assert "data set splits" not in caplog.text


def test_a_path_listed_twice_with_different_labels_is_warned_about_and_kept_as_written(image_folder, tmp_path,
                                                                                       caplog):
    photos = sorted(image_folder.rglob("*.jpg"))[:2]
    lst = tmp_path / "list.csv"
    lst.write_text(f"{photos[0]},cat\n{photos[1]},dog\n{photos[0]},dog\n{photos[1]},dog\n")
    m = build(lst, tmp_path / "c", workers=0).manifest
    assert m.num_samples == 4 and f"{photos[0]} is labelled differently on lines 1 and 3" in caplog.text
    assert "such lines" not in caplog.text   # line 4 repeats line 2's label: no clash
