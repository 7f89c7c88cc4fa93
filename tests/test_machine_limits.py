"""What this process may use, not what the node has: usable_cpus() honours a cgroup CPU quota (a
Kubernetes CPU limit, docker --cpus), and memory_total() the memory cgroup's limit. In a pod limited to
8 CPUs on a 96-core node, 96 build workers were throttled to 8 CPUs' time."""
from __future__ import annotations

import os
from pathlib import Path

from fastdata._util import _cgroup_memory, cgroup_cpu_quota, usable_cpus


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


def test_memory_total_is_the_cgroup_limit_where_that_is_smaller(monkeypatch):
    """plan and info compared caches with the node's RAM: a 16 GB pod on a 512 GB node was told a 200 GB
    raw cache 'fits in half of RAM'."""
    import fastdata._util as util

    monkeypatch.setattr(util, "_meminfo", lambda field: 512 << 30)
    monkeypatch.setattr(util, "_cgroup_memory", lambda: (16 << 30, 15 << 30))
    assert util.memory_total() == 16 << 30 and util.cgroup_room() == 15 << 30
    monkeypatch.setattr(util, "_cgroup_memory", lambda: None)
    assert util.memory_total() == 512 << 30 and util.cgroup_room() is None


def test_memory_limit_and_room_are_the_tightest_levels_of_the_path(tmp_path):
    """A pod's limit sits above its container's cgroup: the container's own memory.max says max."""
    proc = tmp_path / "cgroup"
    proc.write_text("0::/kubepods/pod1/ctr\n")
    pod, ctr = tmp_path / "fs" / "kubepods" / "pod1", tmp_path / "fs" / "kubepods" / "pod1" / "ctr"
    _write(pod / "memory.max", f"{16 << 30}\n")
    _write(pod / "memory.current", f"{10 << 30}\n")      # the pod's other containers use memory too
    _write(ctr / "memory.max", "max\n")
    _write(ctr / "memory.current", f"{2 << 30}\n")
    assert _cgroup_memory(tmp_path / "fs", proc) == (16 << 30, 6 << 30)
    _write(ctr / "memory.max", f"{4 << 30}\n")
    assert _cgroup_memory(tmp_path / "fs", proc) == (4 << 30, 2 << 30)


def test_v1_memory_cgroup_and_no_limit(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    _write(tmp_path / "fs" / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")   # v1's "none"
    _write(tmp_path / "fs" / "memory" / "memory.usage_in_bytes", "1000\n")
    assert _cgroup_memory(tmp_path / "fs", proc) is None
    _write(tmp_path / "fs" / "memory" / "memory.limit_in_bytes", f"{1 << 30}\n")
    assert _cgroup_memory(tmp_path / "fs", proc) == (1 << 30, (1 << 30) - 1000)
    assert _cgroup_memory(tmp_path / "fs", tmp_path / "missing") is None
