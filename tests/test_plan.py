"""The size and speed planner: estimates close to what a build writes, and the rules it recommends by."""
from __future__ import annotations

from fastdata.cache.codecs import CodecConfig
from fastdata.cache.plan import _choose, plan
from fastdata.cache.sources import discover
from fastdata.cli import main

from helpers import build

GB = 10**9


def test_estimates_match_the_caches_a_build_writes(image_folder, tmp_path):
    items = discover(image_folder).items
    p = plan(items, CodecConfig(size=64), str(tmp_path / "c"))
    raw = sum(s.bytes for s in build(image_folder, tmp_path / "raw", workers=0).manifest.shards)
    jpeg = sum(s.bytes for s in build(image_folder, tmp_path / "jpg", workers=0, encode="jpeg").manifest.shards)
    assert p.inputs == 120 and p.sampled == 120 and p.bad_share == 0
    assert abs(p.raw_bytes - raw) / raw < 0.05          # shards add only their small index arrays
    assert abs(p.jpeg_bytes - jpeg) / jpeg < 0.3
    assert p.rate_per_core > 0 and p.choice == "raw" and "fits in half of RAM" in p.reason


def test_recommendation_rules():
    assert _choose(10 * GB, 1 * GB, 64 * GB, 500 * GB, 256)[0] == "raw"
    assert _choose(250 * GB, 20 * GB, 128 * GB, 500 * GB, 256)[0] == "jpeg"
    assert _choose(250 * GB, 100 * GB, 64 * GB, 500 * GB, 256)[0] == "raw, streamed"
    choice, reason = _choose(250 * GB, 30 * GB, 16 * GB, 20 * GB, 256)
    assert choice.startswith("--size ") and int(choice.split()[1]) < 256 and "free disk" in reason


def test_dry_run_writes_nothing(image_folder, tmp_path, capsys):
    assert main(["build-cache", str(image_folder), str(tmp_path / "c"), "--dry-run", "--size", "64"]) == 0
    assert "recommended: raw" in capsys.readouterr().out and not (tmp_path / "c").exists()
    assert main(["plan", str(image_folder), "--size", "64"]) == 0


def test_inputs_far_smaller_than_the_target_are_flagged_by_plan_and_build(tmp_path, caplog):
    """CIFAR-sized 32 px images at the default --size 256: a cache 64x the pixels, no detail gained."""
    from helpers import noise_folder

    items = discover(noise_folder(tmp_path / "src", per_class=10, hw=(32, 40), ext="png")).items
    note = plan(items, CodecConfig(size=256), None).note
    assert "median short side 32 px" in note and "~64x larger" in note and "consider --size 32" in note
    assert plan(items, CodecConfig(size=48), None).note == ""        # 1.5x: a normal resize, no note
    with caplog.at_level("WARNING", logger="fastdata.build"):
        build(tmp_path / "src", tmp_path / "c", workers=0, size=256)
    assert "consider --size 32" in caplog.text


def test_settings_no_image_can_be_made_with_exit_2_before_the_source_is_read(image_folder, tmp_path, capsys):
    """plan and --dry-run check --size/--quality as build-cache does (a size of 0 was a PIL traceback)."""
    for argv in (["plan", str(image_folder), "--size", "0"], ["plan", "/no/such/folder", "--size", "-5"],
                 ["build-cache", str(image_folder), str(tmp_path / "c"), "--dry-run", "--quality", "0"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and ("--size" in err[0] or "--quality" in err[0]), err
    assert not (tmp_path / "c").exists()


def test_plan_warns_when_srcs_classes_are_split_folders(tmp_path, capsys):
    from PIL import Image

    from fastdata.cli import main

    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / "ds" / split / cls).mkdir(parents=True)
            Image.new("RGB", (40, 30), (10, 20, 30)).save(tmp_path / "ds" / split / cls / "x.jpg")
    assert main(["plan", str(tmp_path / "ds")]) == 0
    assert f"build each split on its own (SRC {tmp_path / 'ds' / 'train'})" in capsys.readouterr().out
