"""Messy inputs a new user brings (issue #17 write side, #18 build): each test failed before its fix."""
from __future__ import annotations

import json
import re
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from fastdata.cache.merge import merge_caches
from fastdata.cache.verify import verify_cache
from fastdata.cli import main
from fastdata.read.dataset import CacheDataset
from fastdata.errors import BuildError, FastdataError, SourceError

from helpers import build


def _tree(image_folder: Path, root: Path, classes=("a", "b", "c"), per_class: int = 3) -> Path:
    """A small ImageFolder of real photos copied from the session's image folder."""
    photos = sorted(image_folder.rglob("*.jpg"))
    k = 0
    for c in classes:
        (root / c).mkdir(parents=True)
        for j in range(per_class):
            shutil.copyfile(photos[k], root / c / f"{j:03d}.jpg")
            k += 1
    return root


def test_nonempty_foreign_dest_is_refused_and_nothing_is_deleted(image_folder, tmp_path, capsys):
    src = _tree(image_folder, tmp_path / "src")
    dest = tmp_path / "work"
    dest.mkdir()
    (dest / "shard-plan.txt").write_text("my notes")
    (dest / "shard-00000.h5").write_text("not ours")
    assert main(["build-cache", str(src), str(dest), "--no-progress", "--size", "32"]) == 2
    err = capsys.readouterr().err
    assert f"DEST {dest} is not empty and not a fastdata cache" in err and "\n" not in err.strip()
    assert (dest / "shard-plan.txt").read_text() == "my notes" and (dest / "shard-00000.h5").read_text() == "not ours"
    assert not (dest / ".build").exists()


def test_a_users_file_in_a_cache_folder_survives_a_resume(image_folder, tmp_path):
    src = _tree(image_folder, tmp_path / "src")
    dest = tmp_path / "c"
    build(src, dest, workers=0)
    (dest / "manifest.json").unlink()      # looks unfinished: the resume path cleans strays
    (dest / "shard-plan.txt").write_text("mine")
    (dest / "shard-00099.h5.tmp").write_text("a stray of ours")
    build(src, dest, workers=0)
    assert (dest / "shard-plan.txt").read_text() == "mine" and not (dest / "shard-00099.h5.tmp").exists()


def test_cache_inside_src_is_not_a_class(image_folder, tmp_path):
    src = _tree(image_folder, tmp_path / "src")
    first = build(src, src / "cache", workers=0)
    second = build(src, src / "cache2", workers=0)
    assert list(first.manifest.label_map) == list(second.manifest.label_map) == ["a", "b", "c"]
    assert second.manifest.num_samples == 9 and "a fastdata cache" in second.skipped


def test_a_cache_given_as_src_is_named_as_a_cache(image_folder, tmp_path):
    src = _tree(image_folder, tmp_path / "src")
    build(src, tmp_path / "cache", workers=0)
    with pytest.raises(SourceError, match=r"is a fastdata cache, not an image folder: read it with fastdata.loader"):
        build(tmp_path / "cache", tmp_path / "again", workers=0)
    assert not (tmp_path / "again").exists()


def test_empty_class_folder_is_refused_unless_allowed(image_folder, tmp_path):
    src = _tree(image_folder, tmp_path / "src")
    (src / "b_empty").mkdir()
    (src / "b_empty" / "notes.txt").write_text("no images here")
    with pytest.raises(SourceError, match=f"class folder {src / 'b_empty'} holds no image files"):
        build(src, tmp_path / "c", workers=0)
    assert not (tmp_path / "c").exists()
    m = build(src, tmp_path / "c", workers=0, allow_empty_classes=True).manifest
    assert m.label_map == {"a": 0, "b": 1, "b_empty": 2, "c": 3}
    assert sorted(set(CacheDataset(tmp_path / "c").cache.labels().tolist())) == [0, 1, 3]


def test_the_loader_and_plan_take_allow_empty_classes_as_build_cache_does(image_folder, tmp_path, capsys):
    """The error told a fastdata.loader user to pass --allow-empty-classes, which only build-cache took;
    `build-cache --dry-run --allow-empty-classes` and `plan` refused the folder anyway."""
    import fastdata

    src = _tree(image_folder, tmp_path / "src")
    (src / "b_empty").mkdir()
    with pytest.raises(SourceError, match=r"allow_empty_classes=True in Python"):
        fastdata.loader(src, 2, backend="pil", device="cpu")
    ld = fastdata.loader(src, 4, backend="pil", device="cpu", shuffle=False, allow_empty_classes=True)
    labels = sorted(int(y) for _, ys in ld for y in ys)
    assert labels == [0] * 3 + [1] * 3 + [3] * 3 and ld.num_classes == 4
    assert main(["plan", str(src)]) == 2
    assert "holds no image files" in capsys.readouterr().err
    assert main(["plan", str(src), "--allow-empty-classes"]) == 0
    assert main(["build-cache", str(src), str(tmp_path / "c"), "--dry-run", "--allow-empty-classes"]) == 0
    assert "recommended:" in capsys.readouterr().out and not (tmp_path / "c").exists()


def test_symlinked_folders_are_followed_and_loops_skipped_and_reported(image_folder, tmp_path):
    src = _tree(image_folder, tmp_path / "src")
    extra = _tree(image_folder, tmp_path / "elsewhere", classes=("x",), per_class=4) / "x"
    os.symlink(extra, src / "a" / "more")                 # a symlinked sub-folder inside a class
    os.symlink(src / "a", src / "a" / "more_loop")        # a loop back to its class folder
    os.symlink(src, src / "b" / "up")                     # a loop back to SRC
    (src / "c" / ".hidden.jpg").write_bytes(b"x")
    (src / "c" / "readme.md").write_text("hi")
    res = build(src, tmp_path / "c", workers=0)
    keys = {q for q in CacheDataset(tmp_path / "c").cache.shard(0).keys}
    assert res.manifest.num_samples == 9 + 4 and {f"a/more/{j:03d}.jpg" for j in range(4)} <= keys
    assert "2 symlink loop" in res.skipped and "1 hidden" in res.skipped and "1 not an image file" in res.skipped


def test_a_hidden_folder_beside_the_classes_is_reported_not_made_a_class(image_folder, tmp_path):
    src = _tree(image_folder, tmp_path / "src")
    shutil.copytree(src / "a", src / ".ipynb_checkpoints")     # Jupyter leaves these beside the classes
    res = build(src, tmp_path / "c", workers=0)
    assert res.manifest.label_map == {"a": 0, "b": 1, "c": 2} and res.manifest.num_samples == 9
    assert res.skipped == "1 entry skipped: 1 hidden"


def test_only_broken_inputs_is_a_build_error_naming_the_list(tmp_path, capsys):
    src = tmp_path / "src" / "k"
    src.mkdir(parents=True)
    (src / "a.jpg").write_bytes(b"")
    (src / "b.png").write_bytes(b"not a png at all")
    dest = tmp_path / "c"
    assert main(["build-cache", str(src.parent), str(dest), "--no-progress", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    listing = dest / ".build" / "quarantined.txt"
    assert "all 2 were quarantined" in err and str(listing) in err
    assert sorted(line.split("\t")[0] for line in listing.read_text().splitlines()) == ["k/a.jpg", "k/b.png"]
    assert not (dest / "manifest.json").exists()


@pytest.mark.parametrize("text,sep", [
    ("\ufeffimage,class\n{a},cat\n{b},dog\n", ","),
    ("path label\n{a} cat\n# comment\n\n{b}   dog\n", " "),
    ("{a}\tcat\n{b}\tdog\n", "\t"),
])
def test_file_lists_with_header_bom_and_whitespace(image_folder, tmp_path, text, sep):
    photos = sorted(image_folder.rglob("*.jpg"))[:2]
    lst = tmp_path / "list.txt"
    lst.write_text(text.format(a=photos[0], b=photos[1]), encoding="utf-8")
    m = build(lst, tmp_path / "c", workers=0).manifest
    assert m.num_samples == 2 and m.label_map == {"cat": 0, "dog": 1}


def test_file_list_errors_give_the_files_own_line_number(image_folder, tmp_path):
    photo = sorted(image_folder.rglob("*.jpg"))[0]
    lst = tmp_path / "list.csv"
    lst.write_text(f"\ufeffpath,label\n# a comment\n\n{photo},1\nmissing.jpg,2\n")
    with pytest.raises(SourceError, match=r"line 5 names .*missing.jpg, which does not exist"):
        build(lst, tmp_path / "c", workers=0)
    lst.write_text(f"{photo},1\n{photo},-3\n")
    with pytest.raises(SourceError, match="line 2 has label -3; labels must be 0 or more"):
        build(lst, tmp_path / "c", workers=0)


def test_integer_labels_become_contiguous_ids_and_the_map_keeps_the_originals(image_folder, tmp_path):
    photos = sorted(image_folder.rglob("*.jpg"))[:6]
    lst = tmp_path / "list.csv"
    lst.write_text("".join(f"{p},{10 * k}\n" for k, p in enumerate(photos)) + f"{photos[0]},010\n")
    dest = tmp_path / "c"
    m = build(lst, dest, workers=0).manifest
    assert m.label_map == {str(10 * k): k for k in range(6)}
    assert CacheDataset(dest).cache.labels().tolist() == [0, 1, 2, 3, 4, 5, 1]


def _parts(image_folder, tmp_path, n=3):
    return [build(image_folder, tmp_path / f"p{i}", workers=0, part=(i, n)) and tmp_path / f"p{i}"
            for i in range(n)]


def test_merge_takes_any_order_and_refuses_duplicate_missing_and_foreign_parts(image_folder, tmp_path):
    parts = _parts(image_folder, tmp_path)
    full = build(image_folder, tmp_path / "full", workers=0).manifest
    merged = merge_caches(tmp_path / "m", [parts[2], parts[0], parts[1]])
    assert merged.num_samples == full.num_samples
    assert CacheDataset(tmp_path / "m").cache.labels().tolist() == CacheDataset(tmp_path / "full").cache.labels().tolist()
    assert verify_cache(tmp_path / "m").ok
    with pytest.raises(BuildError, match="part 0/3 given twice"):
        merge_caches(tmp_path / "m2", [parts[0], parts[0], parts[1], parts[2]])
    with pytest.raises(BuildError, match=r"part\(s\) 2 of 3 missing"):
        merge_caches(tmp_path / "m3", parts[:2])
    other = build(image_folder, tmp_path / "q1", workers=0, part=(1, 3), size=32)
    assert other
    with pytest.raises(BuildError, match="differs|differ from"):
        merge_caches(tmp_path / "m4", [parts[0], tmp_path / "q1", parts[2]])
    with pytest.raises(BuildError, match="not built with --part"):
        merge_caches(tmp_path / "m5", [tmp_path / "full"])
    assert not (tmp_path / "m2").exists() and not (tmp_path / "m3").exists()


@pytest.mark.parametrize("damage", ["delete", "flip"])
def test_missing_or_damaged_shard_of_a_finished_cache_is_rebuilt(image_folder, tmp_path, damage):
    dest = tmp_path / "c"
    first = build(image_folder, dest, workers=0)
    before = (dest / "manifest.json").read_bytes()
    victim = dest / first.manifest.shards[1].name
    if damage == "delete":
        victim.unlink()
    else:
        raw = bytearray(victim.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        victim.write_bytes(bytes(raw))
    again = build(image_folder, dest, workers=0)
    assert not again.already_built and [n for n, _ in again.repaired] == [victim.name]
    assert again.written == first.manifest.shards[1].count and victim.name in again.summary()
    assert (dest / "manifest.json").read_bytes() == before and verify_cache(dest).ok


@pytest.mark.parametrize("argv", [
    ["build-cache", "{src}", "gs://bucket/x"], ["build-cache", "http://host/src", "{tmp}/c"],
    ["verify", "gs://bucket/x"], ["info", "az://bucket/x"], ["stage", "{tmp}/c", "s3://b/y"],
    ["merge", "s3://b/out", "{tmp}/c"],
])
def test_urls_are_refused_not_made_into_local_folders(image_folder, tmp_path, argv, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    build(image_folder, tmp_path / "c", workers=0)
    argv = [a.format(src=image_folder, tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    assert ":// URLs are not supported here" in capsys.readouterr().err
    assert not any(p.name.endswith(":") for p in tmp_path.iterdir())
    import fastdata

    with pytest.raises(FastdataError, match="not supported"):
        fastdata.loader("gs://bucket/x", 4, device="cpu")


def test_dangling_symlink_is_quarantined_naming_its_target(image_folder, tmp_path):
    src = _tree(image_folder, tmp_path / "src")
    os.symlink(tmp_path / "gone.jpg", src / "a" / "lost.jpg")
    m = build(src, tmp_path / "c", workers=0).manifest
    assert m.num_samples == 9
    assert [(q["path"], q["reason"]) for q in m.quarantined] == [
        ("a/lost.jpg", f"dangling symlink: its target {tmp_path / 'gone.jpg'} does not exist")]


@pytest.mark.parametrize("fmt", ["h5", "pt"])
def test_file_names_that_are_not_utf8_build_and_read_back_losslessly(image_folder, tmp_path, fmt, capsys):
    src = _tree(image_folder, tmp_path / "src")
    odd = os.fsdecode(b"caf\xe9-\xff.jpg")
    shutil.copyfile(src / "a" / "000.jpg", os.path.join(src / "b", odd))
    dest = tmp_path / "c"
    assert main(["build-cache", str(src), str(dest), "--no-progress", "--workers", "0", "--format", fmt,
                 "--size", "32"]) == 0
    keys = [k for i in range(CacheDataset(dest).cache.num_shards) for k in CacheDataset(dest).cache.shard(i).keys]
    assert f"b/{odd}" in keys and os.fsencode(f"b/{odd}") == b"b/caf\xe9-\xff.jpg"
    assert verify_cache(dest).ok and main(["info", str(dest)]) == 0
    img = CacheDataset(dest)[keys.index(f"b/{odd}")][0].numpy()
    assert np.array_equal(img, CacheDataset(dest)[0][0].numpy())   # the same photo as a/000.jpg
    capsys.readouterr()
    json.loads((dest / "manifest.json").read_text())


def test_build_summary_is_printed_once(image_folder, tmp_path):
    import subprocess
    import sys

    src = _tree(image_folder, tmp_path / "src")
    out = subprocess.run([sys.executable, "-m", "fastdata.cli", "build-cache", str(src), str(tmp_path / "c"),
                          "--no-progress", "--workers", "0"], capture_output=True, text=True)
    assert out.returncode == 0
    assert (out.stdout + out.stderr).count("9 samples in") == 1


def test_info_into_a_closed_pipe_ends_quietly(image_folder, tmp_path):
    import subprocess
    import sys

    src = _tree(image_folder, tmp_path / "src")
    for k in range(3000):   # enough quarantine lines to outgrow the pipe's 64 KiB buffer
        (src / "a" / f"bad{k:04d}.jpg").write_bytes(b"broken")
    build(src, tmp_path / "c", workers=0)
    cmd = f"{sys.executable} -m fastdata.cli info {tmp_path / 'c'} | head -1"
    out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
    assert out.stdout.count("\n") == 1 and "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr


def test_every_option_has_help_text():
    from fastdata.cli import _parser

    sub = next(a for a in _parser()._actions if a.dest == "cmd")
    missing = [f"{name} {a.option_strings or a.dest}" for name, p in sub.choices.items() for a in p._actions
               if a.help is None]
    assert not missing, missing


def test_pipes_and_links_to_devices_are_skipped_not_read(image_folder, tmp_path):
    """A FIFO blocked the build at open() forever, and a .jpg link to /dev/zero read until memory ran
    out; a file list naming either is refused by line. Run in a child with a timeout: a regression hangs."""
    import subprocess
    import sys

    src = _tree(image_folder, tmp_path / "src")
    os.mkfifo(src / "a" / "pipe.jpg")
    os.symlink("/dev/zero", src / "b" / "zero.jpg")
    code = ("import sys; from fastdata.cache.build import BuildConfig, build_cache\n"
            "r = build_cache(BuildConfig(src=sys.argv[1], dest=sys.argv[2], workers=0, progress=False))\n"
            "print(r.manifest.num_samples, '|', r.skipped)\n")
    out = subprocess.run([sys.executable, "-c", code, str(src), str(tmp_path / "c")], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("9 |") and "2 not a regular file" in out.stdout
    listing = tmp_path / "list.csv"
    listing.write_text(f"path,label\n{src / 'a' / 'x.jpg'},a\n{src / 'b' / 'zero.jpg'},b\n")
    (src / "a" / "x.jpg").write_bytes(next((image_folder).rglob("*.jpg")).read_bytes())
    with pytest.raises(SourceError, match=r"line 3 names .*zero.jpg, which is not a regular file"):
        build(listing, tmp_path / "c2", workers=0)


def test_an_input_swapped_for_a_pipe_after_discovery_is_quarantined(tmp_path):
    from fastdata.cache.codecs import read_file

    os.mkfifo(tmp_path / "late.jpg")
    assert read_file(str(tmp_path / "late.jpg")) == "not a regular file (a device, pipe or socket): not read"


def test_a_jpeg_over_pils_pixel_limit_is_built_at_reduced_scale(tmp_path, monkeypatch):
    """A 200-megapixel phone photo is over PIL's decompression-bomb limit (2 x 89.5M pixels), which refused
    it before reading a pixel. libjpeg's 1/8-scale decode needs a few MB, so where the target size allows
    it the JPEG is built; a PNG that large, or a target too big for the draft, is still quarantined."""
    from PIL import Image

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1_000_000)     # the same rule, at test scale
    yy, xx = np.mgrid[0:1000, 0:3000]
    arr = np.stack([xx * 255 // 2999, yy * 255 // 999, (xx // 100 + yy // 100) % 2 * 255], -1).astype(np.uint8)
    (tmp_path / "src" / "a").mkdir(parents=True)
    Image.fromarray(arr).save(tmp_path / "src" / "a" / "huge.jpg", quality=90)
    Image.fromarray(arr).save(tmp_path / "src" / "a" / "huge.png")
    m = build(tmp_path / "src", tmp_path / "c", workers=0, size=64).manifest
    assert m.num_samples == 1 and [q["path"] for q in m.quarantined] == ["a/huge.png"]
    assert "decompression bomb" in m.quarantined[0]["reason"]
    ref = np.asarray(Image.fromarray(arr[:, 1000:2000]).resize((64, 64), Image.BILINEAR), dtype=np.int16)
    got = CacheDataset(tmp_path / "c")[0][0].numpy().astype(np.int16)
    assert np.abs(got - ref).mean() < 4      # the same picture: ramps and a checkerboard, drafted
    with pytest.raises(BuildError, match="no input could be decoded"):   # 900 px: no draft applies
        build(tmp_path / "src", tmp_path / "c900", workers=0, size=900)


@pytest.mark.parametrize("name,needle", [
    ("train.zip", "train.zip holds the images: unpack it first (unzip"),
    ("imagenet.tar.gz", "imagenet.tar.gz holds the images: unpack it first (tar xzf"),
    ("data-00000.parquet", "is a Parquet data set (Hugging Face datasets): save its images to class folders"),
    ("cifar.npz", "is NumPy arrays: save its images"),
])
def test_a_folder_holding_a_downloaded_archive_says_what_to_do(tmp_path, name, needle):
    """Kaggle zips, .tar.gz downloads and Hugging Face parquet files: 'no image files found' said nothing."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / name).write_bytes(b"not unpacked")
    with pytest.raises(SourceError, match=re.escape(needle)):
        build(tmp_path / "src", tmp_path / "c", workers=0)
    assert not (tmp_path / "c").exists()


def test_reading_an_unfinished_build_says_to_finish_it(image_folder, tmp_path):
    """A killed build (shards and .build/, no manifest) read by the loader was called "a fastdata cache,
    not an image folder: read it with fastdata.loader(...)", which is what the user had just done."""
    import fastdata

    build(image_folder, tmp_path / "c", workers=0)
    (tmp_path / "c" / "manifest.json").unlink()
    (tmp_path / "c" / ".build").mkdir(exist_ok=True)
    with pytest.raises(SourceError, match="build has not finished .*rerun the same `fastdata build-cache`"):
        fastdata.loader(tmp_path / "c", 4, backend="pil", device="cpu")
    with pytest.raises(SourceError, match="build has not finished"):
        fastdata.loader(tmp_path / "c", 4, device="cpu")


def test_a_path_starting_with_tilde_is_the_home_folder(image_folder, tmp_path, monkeypatch):
    """torchvision's datasets expand '~'; ours took it literally: a build to '~/cache' (quoted, or from
    Python) made a folder named '~' in the working directory, and the loader said '~/...' does not exist."""
    import fastdata

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    assert main(["build-cache", str(image_folder), "~/cache", "--size", "32", "--no-progress"]) == 0
    assert (tmp_path / "home" / "cache" / "manifest.json").is_file() and not (tmp_path / "~").exists()
    assert len(fastdata.loader("~/cache", 8, device="cpu")) == len(fastdata.loader(tmp_path / "home" / "cache", 8,
                                                                                   device="cpu"))
    assert len(CacheDataset("~/cache")) == 120 and main(["info", "~/cache"]) == 0


def test_a_missing_input_is_named_with_every_kind_of_input(tmp_path, capsys):
    """The message said "SRC ... or a file list" to loader and train users too, and left out tars and caches."""
    import fastdata

    with pytest.raises(SourceError, match=r"nope does not exist; give an image folder .*a \.tar .*or a cache"):
        fastdata.loader(tmp_path / "nope", 4, device="cpu")
    assert main(["build-cache", str(tmp_path / "nope"), str(tmp_path / "c")]) == 2
    assert "SRC" not in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_a_caches_manifest_or_an_image_given_as_the_input_says_what_to_give(image_folder, tmp_path, capsys):
    """Pointing at out/manifest.json (or one photo) said only "not a list"; the manifest now names its folder."""
    import fastdata

    build(_tree(image_folder, tmp_path / "src"), cache := tmp_path / "c")
    with pytest.raises(SourceError, match=rf"manifest; give the cache folder, {re.escape(str(cache))}$"):
        fastdata.loader(cache / "manifest.json", 4, device="cpu")
    photo = next((tmp_path / "src" / "a").iterdir())
    assert main(["build-cache", str(photo), str(tmp_path / "c2")]) == 2
    assert "give an image folder (class sub-folders)" in capsys.readouterr().err and not (tmp_path / "c2").exists()
