"""The one read pipeline: the resume contract over every backend, options, sources, the import graph."""
from __future__ import annotations

import ast
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

import fastdata
from fastdata.errors import LoaderError
from fastdata.read.augment import AugmentConfig

from helpers import build, check_resume_contract

AUG = AugmentConfig(size=32, dtype="float32")


@pytest.fixture(scope="module")
def tar_source(image_folder, tmp_path_factory):
    """A WebDataset-style tar: samples grouped by basename (.jpg + .cls)."""
    tar = tmp_path_factory.mktemp("tar") / "train-000.tar"
    with tarfile.open(tar, "w") as tf:
        for k, p in enumerate(sorted(Path(image_folder).rglob("*.jpg"))[:40]):
            for name, data in ((f"s/{k:04d}.jpg", p.read_bytes()), (f"s/{k:04d}.cls", str(k % 4).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return tar


def _dali_ok() -> bool:
    from fastdata.read.verbs import dali_available

    return dali_available()


CASES = [("raw", "raw_cache"), ("raw", "jpeg_cache"), ("raw", "variable_cache"), ("pil", "image_folder"), ("pil", "jpeg_cache"),
         ("pil", "tar_source"), ("dali", "image_folder"), ("dali", "jpeg_cache")]


@pytest.mark.parametrize("backend,data", CASES)
def test_resume_contract_over_every_backend(backend, data, request):
    if backend == "dali" and not _dali_ok():
        pytest.skip("DALI is not installed")
    path = request.getfixturevalue(data)

    def make(rank, world):
        return fastdata.loader(path, 16, backend=backend, device="cpu", seed=5, augment=AUG, rank=rank,
                               world_size=world, threads=2)

    assert make(0, 1).cfg.backend == backend
    check_resume_contract(make, f"{backend}/{data}")


def test_tar_source_is_read_end_to_end_like_its_built_cache(tar_source, tmp_path):
    """The Source seam: the same tar read in place by the pil backend and built into a cache give the
    same labels for the same samples, and the same eval pixels within resize differences."""
    evalaug = AugmentConfig(size=32, train=False)
    direct = list(fastdata.loader(tar_source, 8, backend="pil", device="cpu", shuffle=False, augment=evalaug))
    assert direct[0].source == "pil-tar"
    build(tar_source, tmp_path / "c", workers=0, encode="jpeg", quality=95, size=48, resize="short")
    cached = list(fastdata.loader(tmp_path / "c", 8, backend="pil", device="cpu", shuffle=False, augment=evalaug))
    a, b = (torch.cat([x.labels for x in bs]) for bs in (direct, cached))
    assert a.tolist() == b.tolist() == [k % 4 for k in range(40)]
    pa, pb = (torch.cat([x.images for x in bs]) for bs in (direct, cached))
    assert (pa - pb).abs().mean() < 0.15


def test_an_option_of_another_backend_names_the_backends_that_take_it(raw_cache, image_folder):
    with pytest.raises(LoaderError, match=r"pipelines= does not apply to backend raw: only backend dali takes it"):
        fastdata.loader(raw_cache, 8, device="cpu", pipelines=2)
    with pytest.raises(LoaderError, match=r"memory= does not apply to backend pil: only backend raw takes it"):
        fastdata.loader(image_folder, 8, backend="pil", device="cpu", memory="1GB")
    with pytest.raises(LoaderError, match=r"colour= does not apply to backend raw: no backend takes it"):
        fastdata.loader(raw_cache, 8, device="cpu", colour=True)
    with pytest.raises(LoaderError, match=r"backend 'tpu'"):
        fastdata.loader(raw_cache, 8, backend="tpu", device="cpu")


def test_auto_and_wave1_names_pick_the_expected_backend(raw_cache, jpeg_cache, image_folder, monkeypatch):
    import fastdata.read.verbs as verbs

    assert fastdata.loader(raw_cache, 8, device="cpu").cfg.backend == "raw"
    assert fastdata.loader(raw_cache, 8, backend="cache", device="cpu").cfg.backend == "raw"
    assert fastdata.loader(jpeg_cache, 8, device="cpu").cfg.backend == "raw"     # uint8 asked: gathered
    monkeypatch.setattr(verbs, "dali_available", lambda: False)
    assert fastdata.loader(jpeg_cache, 8, device="cpu", augment=True).cfg.backend == "pil"
    assert fastdata.decode_loader(image_folder, 8, backend="cpu").cfg.backend == "pil"
    assert fastdata.dataloader is fastdata.tuned_dataloader


def test_state_is_versioned_and_a_newer_version_is_refused(raw_cache):
    dl = fastdata.loader(raw_cache, 8, device="cpu")
    state = dl.state_dict()
    assert state["version"] == 2 and state["backend"] == "raw"
    old = {k: v for k, v in state.items() if k in ("order", "coverage")}    # a wave-1 state loads
    fastdata.loader(raw_cache, 8, device="cpu").load_state_dict(old)
    with pytest.raises(LoaderError, match="newer fastdata"):
        fastdata.loader(raw_cache, 8, device="cpu").load_state_dict({**state, "version": 99})


def _imports(path: Path, module: str) -> set[str]:
    """fastdata modules that `module` imports, anywhere in the file (lazy imports count too)."""
    pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("fastdata")}
        elif isinstance(node, ast.ImportFrom):
            base = pkg[:len(pkg) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            if name.startswith("fastdata"):
                out.add(name)
                out |= {f"{name}.{a.name}" for a in node.names}
    return out


def test_the_package_has_no_import_cycles():
    """Between sub-packages (read, cache, engine, monitor, stores, cli), lazy imports included: each
    layer only looks down the flow (DESIGN.md), so none can need one that needs it."""
    root = Path(fastdata.__file__).parent
    edges: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root.parent).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        src = module.split(".")[1] if "." in module else ""
        for target in _imports(path, module):
            dst = target.split(".")[1] if target.count(".") else ""
            if src and dst and src != dst and (root / dst).is_dir() and (root / src).is_dir():
                edges.setdefault(src, set()).add(dst)

    def reach(a, seen):
        for b in edges.get(a, ()):
            if b not in seen:
                seen.add(b)
                reach(b, seen)
        return seen

    cycles = sorted(f"{a} -> {b} -> ... -> {a}" for a in edges for b in edges[a] if a in reach(b, set()))
    assert not cycles, "import cycles between sub-packages: " + "; ".join(cycles)


def test_stage_option_reads_from_the_staged_copy_and_reuses_it(raw_cache, tmp_path):
    """The tmpfs store: loader(stage=) copies the cache once and reads the copy, sample for sample."""
    target = tmp_path / "shm" / "c"
    dl = fastdata.loader(raw_cache, 16, device="cpu", shuffle=False, stage=str(target))
    assert dl.backend.cache.path == target and (target / "manifest.json").is_file()
    ref = fastdata.loader(raw_cache, 16, device="cpu", shuffle=False)
    for a, b in zip(dl, ref):
        assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    mtime = (target / "manifest.json").stat().st_mtime_ns
    again = fastdata.loader(raw_cache, 16, device="cpu", stage=str(target))
    assert again.backend.cache.path == target and (target / "manifest.json").stat().st_mtime_ns == mtime


def test_a_packed_slot_grows_when_a_batch_needs_more_room(variable_cache):
    from fastdata.read.dataset import CacheDataset
    from fastdata.read.fill import fill_packed
    from fastdata.read.reader import open_cache

    cache, ds = open_cache(variable_cache), CacheDataset(variable_cache)
    slot = {"images": torch.zeros(10, dtype=torch.uint8), "labels": torch.zeros(4, dtype=torch.int64)}
    idx = np.array([1, 2, 50, 119])
    h, w, offsets = fill_packed(cache, idx, slot, lambda n: torch.zeros(n, dtype=torch.uint8))
    assert slot["images"].numel() == slot["nbytes"] > 10
    for k, i in enumerate(idx):
        img, label = ds[int(i)]
        assert (h[k], w[k]) == img.shape[:2] and int(slot["labels"][k]) == label
        assert torch.equal(slot["images"][offsets[k]:offsets[k] + img.numel()], img.flatten())


@pytest.mark.parametrize("kernel", ["eager", "compiled"])
def test_variable_shape_raw_cache_goes_through_the_same_crop_path(variable_cache, kernel):
    """--resize short|max caches: samples packed end to end in the slot, each cropped by its own plan;
    equal to cropping each stored image alone with the same plan."""
    from fastdata.read.augment import apply_plan
    from fastdata.read.crop import draw_plan
    from fastdata.read.dataset import CacheDataset

    aug = AugmentConfig(size=32, train=False, kernel=kernel)
    ds = CacheDataset(variable_cache)
    shapes = {tuple(ds[i][0].shape) for i in range(len(ds))}
    assert len(shapes) > 1                                   # really variable
    dl = fastdata.loader(variable_cache, 16, device="cpu", shuffle=False, augment=aug)
    assert dl.cfg.backend == "raw"
    for b in dl:
        assert b.images.shape[1:] == (3, 32, 32)
        for img, i in zip(b.images, b.indices.tolist()):
            one = ds[i][0]
            plan = torch.from_numpy(draw_plan(aug, 0, [one.shape[0]], [one.shape[1]]))
            want = apply_plan(one[None].contiguous(), plan, AugmentConfig(size=32, train=False, kernel="eager"))[0]
            assert torch.allclose(img, want, atol=1e-4)
