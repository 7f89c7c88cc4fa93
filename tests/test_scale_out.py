"""Scale out: Dask executor (LocalCluster), Slurm array recipe with a faked SLURM_ARRAY_TASK_ID."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fastdata.cache.format import load_manifest
from fastdata.cache.verify import verify_cache
from fastdata.read.dataset import CacheDataset

from helpers import build, flaky_build_shard

ROOT = Path(__file__).resolve().parents[1]
dask_distributed = pytest.importorskip("dask.distributed")


def _files(dest: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(dest.iterdir()) if p.is_file()}


def test_dask_local_cluster_build_is_byte_identical_to_the_local_build(image_folder, tmp_path):
    local = build(image_folder, tmp_path / "local", workers=2)
    dask = build(image_folder, tmp_path / "dask", workers=2, executor="dask")
    assert dask.manifest == local.manifest and len(local.manifest.shards) > 1
    assert _files(tmp_path / "dask") == _files(tmp_path / "local")
    assert verify_cache(tmp_path / "dask").ok


def test_dask_retries_a_lost_shard_job(image_folder, tmp_path, monkeypatch):
    from fastdata.cache.build import BuildConfig
    from fastdata.cache.executors import dask_map
    from fastdata.cache.sources import discover

    monkeypatch.setenv("FASTDATA_TEST_FLAKY_DIR", str(tmp_path))
    items = discover(image_folder).items
    cfg = BuildConfig(src=str(image_folder), dest=str(tmp_path / "c"), size=32)
    (tmp_path / "c").mkdir()
    tasks = [(k, items[k * 40:(k + 1) * 40], cfg.codec(), "h5", str(tmp_path / "c"), "quarantine") for k in range(3)]
    with dask_map(None, 2, flaky_build_shard) as run:
        results = sorted(run(tasks), key=lambda r: r[0])
    assert [r[0] for r in results] == [0, 1, 2] and all(r[1].count == 40 and r[3] is None for r in results)
    assert sorted(p.name for p in tmp_path.glob("failed-*")) == ["failed-0", "failed-1", "failed-2"]


def test_slurm_array_recipe_with_a_faked_task_id(image_folder, tmp_path):
    env = {**os.environ, "FASTDATA": f"{sys.executable} -m fastdata.cli", "SLURM_ARRAY_TASK_COUNT": "3",
           "SLURM_ARRAY_TASK_MIN": "0"}
    parts = tmp_path / "parts"
    for task in (2, 0, 1):   # array tasks finish in any order
        out = subprocess.run(["bash", str(ROOT / "tools/slurm/build-cache.sbatch"), str(image_folder), str(parts),
                              "--size", "32", "--workers", "0"], env={**env, "SLURM_ARRAY_TASK_ID": str(task)},
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 0, out.stderr
    out = subprocess.run(["bash", str(ROOT / "tools/slurm/merge.sbatch"), str(tmp_path / "out"), str(parts)],
                         env=env, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "all" in out.stdout and "match their checksums" in out.stdout
    full = build(image_folder, tmp_path / "full", size=32, workers=0)
    merged = load_manifest(tmp_path / "out")
    assert merged.num_samples == full.manifest.num_samples and merged.label_map == full.manifest.label_map
    a, b = CacheDataset(tmp_path / "out"), CacheDataset(tmp_path / "full")
    for i in range(0, len(a), 7):
        assert np.array_equal(a[i][0].numpy(), b[i][0].numpy()) and a[i][1] == b[i][1]


def test_part_slurm_outside_slurm_is_a_clear_error(image_folder, tmp_path, capsys, monkeypatch):
    from fastdata.cli import main

    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["build-cache", str(image_folder), str(tmp_path / "c"), "--part", "slurm"])
    assert e.value.code == 2 and "SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT are not set" in capsys.readouterr().err
