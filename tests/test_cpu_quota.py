"""usable_cpus() honours a cgroup CPU quota (a Kubernetes CPU limit, docker --cpus), not only affinity:
in a pod limited to 8 CPUs on a 96-core node, 96 build workers were throttled to 8 CPUs' time."""
from __future__ import annotations

import os
from pathlib import Path

from fastdata._util import cgroup_cpu_quota, usable_cpus


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v2_takes_the_tightest_level_of_the_path(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/kubepods/pod1/ctr\n")
    _write(tmp_path / "fs" / "cpu.max", "max 100000\n")
    _write(tmp_path / "fs" / "kubepods" / "pod1" / "cpu.max", "800000 100000\n")
    _write(tmp_path / "fs" / "kubepods" / "pod1" / "ctr" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(tmp_path / "fs", proc) == 8.0
    _write(tmp_path / "fs" / "kubepods" / "pod1" / "ctr" / "cpu.max", "150000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "fs", proc) == 1.5


def test_v1_combined_controller_and_a_host_path_not_mounted_in_the_container(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    _write(tmp_path / "fs" / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "fs" / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path / "fs", proc) is None        # no limit anywhere
    _write(tmp_path / "fs" / "cpu,cpuacct" / "cpu.cfs_quota_us", "300000\n")   # the container's own root
    assert cgroup_cpu_quota(tmp_path / "fs", proc) == 3.0


def test_no_cgroup_information_means_no_quota(tmp_path):
    assert cgroup_cpu_quota(tmp_path / "fs", tmp_path / "missing") is None
    (tmp_path / "cgroup").write_text("0::/\n")
    assert cgroup_cpu_quota(tmp_path / "fs", tmp_path / "cgroup") is None


def test_usable_cpus_is_the_smaller_of_affinity_and_quota(monkeypatch):
    import fastdata._util as util

    affinity = len(os.sched_getaffinity(0))
    monkeypatch.setattr(util, "cgroup_cpu_quota", lambda: 0.5)
    assert usable_cpus() == 1
    monkeypatch.setattr(util, "cgroup_cpu_quota", lambda: affinity + 10.0)
    assert usable_cpus() == affinity
    monkeypatch.setattr(util, "cgroup_cpu_quota", lambda: None)
    assert usable_cpus() == affinity
