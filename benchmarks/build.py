"""Build throughput against a plain single-process PIL decode of the same files.

    python benchmarks/build.py [--per-class 60] [--size 256] [--workers N]

Goal (issue 21): build img/s >= 1.5x (cores x the plain single-process full-decode PIL rate).
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from _common import write


def plain_pil_rate(files: list[Path], size: int) -> float:
    """What a user's own script does: open, convert, resize short side, centre crop."""
    from PIL import Image

    t0 = time.perf_counter()
    for p in files:
        img = Image.open(p).convert("RGB")
        w, h = img.size
        k = size / min(w, h)
        img = img.resize((max(size, round(w * k)), max(size, round(h * k))), Image.BILINEAR)
        left, top = (img.width - size) // 2, (img.height - size) // 2
        img.crop((left, top, left + size, top + size)).tobytes()
    return len(files) / (time.perf_counter() - t0)


def codec_rate(files: list[Path], size: int, encode: str) -> float:
    from fastdata.cache.codecs import CodecConfig, process_file

    cfg = CodecConfig(encode=encode, size=size)
    t0 = time.perf_counter()
    for p in files:
        process_file(str(p), cfg)
    return len(files) / (time.perf_counter() - t0)


def gpu_decoder_ok() -> bool:
    try:
        from fastdata.cache.gpu_build import check_gpu_decoder

        check_gpu_decoder()
        return True
    except Exception:  # noqa: BLE001 - no GPU or no torchvision: the row is left out
        return False


def pixel_difference(a: Path, b: Path) -> tuple[float, float]:
    """(mean, worst image's mean) absolute difference in 0..255 levels between two raw caches of the same inputs."""
    import numpy as np

    from fastdata.read.reader import open_cache

    ca, cb = open_cache(a), open_cache(b)
    per = [float(np.abs(ca.raw(i)[0].numpy().astype(np.int16) - cb.raw(i)[0].numpy().astype(np.int16)).mean())
           for i in range(len(ca))]
    return float(np.mean(per)), float(np.max(per))


GPU_VARIANTS = {   # name -> (environment, processes given --workers W: 0 is shard threads in one process)
    "threads, torchvision": ({"FASTDATA_BUILD_ENGINES": "0"}, lambda w: 0),
    "threads, engines": ({"FASTDATA_BUILD_ENGINES": "1"}, lambda w: 0),
    # FASTDATA_BUILD_CPU_PROCESSES of the W processes build with the CPU codec ("" : the default split)
    "processes, torchvision, GPU only": ({"FASTDATA_BUILD_ENGINES": "0", "FASTDATA_BUILD_CPU_PROCESSES": "0"},
                                         lambda w: w),
    "processes, engines, GPU only": ({"FASTDATA_BUILD_ENGINES": "1", "FASTDATA_BUILD_CPU_PROCESSES": "0"},
                                     lambda w: w),
    "processes, torchvision, default split": ({"FASTDATA_BUILD_ENGINES": "0", "FASTDATA_BUILD_CPU_PROCESSES": ""},
                                              lambda w: w),
    "processes, engines, default split": ({"FASTDATA_BUILD_ENGINES": "1", "FASTDATA_BUILD_CPU_PROCESSES": ""},
                                          lambda w: w),
    "processes, torchvision, 2 CPU": ({"FASTDATA_BUILD_ENGINES": "0", "FASTDATA_BUILD_CPU_PROCESSES": "2"},
                                      lambda w: w),
    "processes, torchvision, 6 CPU": ({"FASTDATA_BUILD_ENGINES": "0", "FASTDATA_BUILD_CPU_PROCESSES": "6"},
                                      lambda w: w),
    "processes, torchvision, 8 CPU": ({"FASTDATA_BUILD_ENGINES": "0", "FASTDATA_BUILD_CPU_PROCESSES": "8"},
                                      lambda w: w),
    "processes, engines, 6 CPU": ({"FASTDATA_BUILD_ENGINES": "1", "FASTDATA_BUILD_CPU_PROCESSES": "6"},
                                  lambda w: w),
    # more processes than cores: a GPU shard process waits on its decode, copy and write in turn (CPU ~half idle)
    "processes x1.5, torchvision, 6 CPU": ({"FASTDATA_BUILD_ENGINES": "0", "FASTDATA_BUILD_CPU_PROCESSES": "6"},
                                           lambda w: w * 3 // 2),
    "processes x1.5, torchvision, 8 CPU": ({"FASTDATA_BUILD_ENGINES": "0", "FASTDATA_BUILD_CPU_PROCESSES": "8"},
                                           lambda w: w * 3 // 2),
    "processes x1.5, torchvision, 12 CPU": ({"FASTDATA_BUILD_ENGINES": "0", "FASTDATA_BUILD_CPU_PROCESSES": "12"},
                                            lambda w: w * 3 // 2),
    "processes x2, torchvision, 8 CPU": ({"FASTDATA_BUILD_ENGINES": "0", "FASTDATA_BUILD_CPU_PROCESSES": "8"},
                                         lambda w: w * 2),
}


class Utilization:
    """While inside the block, every 0.25 s: the build's images done (its progress counter, caught as the build
    makes it), the CPU busy fraction (/proc/stat, all CPUs), and NVML GPU and JPEG-engine utilization (NVML adds
    no CUDA context). steady() gives the rate and the means between 20% and 90% of the images: the build once
    every process has started and before the last shards leave workers idle, measured inside one build."""

    LO, HI = 0.2, 0.9

    def __init__(self):
        import threading

        self.samples: list[tuple] = []
        self.counters: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def _cpu() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]          # (total, idle + iowait) jiffies

    def _run(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001 - no NVML here: CPU only
            h = None
        last = self._cpu()
        while not self._stop.wait(0.25):
            now = self._cpu()
            busy = 1 - (now[1] - last[1]) / max(1, now[0] - last[0])
            last = now
            gpu = jpg = float("nan")
            if h is not None:
                try:
                    gpu = pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100
                    jpg = pynvml.nvmlDeviceGetJpgUtilization(h)[0] / 100
                except Exception:  # noqa: BLE001 - an older driver lacks the JPEG counter
                    pass
            done = sum(c.value for c in self.counters)
            self.samples.append((time.perf_counter(), busy, gpu, jpg, done))

    def __enter__(self):
        from fastdata.cache import executors

        self._make = make = executors.progress_counter

        def caught(*a, **kw):   # the build's counter (gpu_map and shard_map fetch it from executors at call time)
            c = make(*a, **kw)
            self.counters.append(c)
            return c
        executors.progress_counter = caught
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        from fastdata.cache import executors

        executors.progress_counter = self._make
        self._stop.set()
        self._thread.join()

    def steady(self, total: int) -> dict:
        """img/s between LO and HI of `total` images done, the means over those seconds, and the seconds
        before the first image was done (start-up); empty where the build was too short to sample."""
        import numpy as np

        s = self.samples
        lo = next((x for x in s if x[4] >= self.LO * total), None)
        hi = next((x for x in s if x[4] >= self.HI * total), None)
        if lo is None or hi is None or hi[0] <= lo[0]:
            return {}
        a = np.array([x[1:4] for x in s if lo[0] < x[0] <= hi[0]])
        out = {k: f"{np.nanmean(a[:, i]):.0%}" if not np.all(np.isnan(a[:, i])) else "-"
               for i, k in enumerate(("CPU busy", "GPU util", "JPG util"))}
        first = next((x[0] for x in s if x[4] > 0), lo[0])
        end = next((x[0] for x in s if x[4] >= total), s[-1][0])
        return {"rate": (hi[4] - lo[4]) / (hi[0] - lo[0]), "start-up s": f"{first - self.t0:.1f}",
                "to 20% s": f"{lo[0] - self.t0:.1f}", "20-90% s": f"{hi[0] - lo[0]:.1f}",
                "90-100% s": f"{end - hi[0]:.1f}", **out}


def disk_write_rate(folder: Path, gib: int = 4) -> float:
    """MB/s of `dd oflag=direct` writing `gib` GiB into folder (the builds' file system): the rate at which
    raw shards can reach the disk, since every shard is fsynced before the journal records it."""
    import subprocess

    target = folder / "dd-write"
    t = time.perf_counter()
    done = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=8M", f"count={gib * 128}", "oflag=direct"],
                          capture_output=True)
    seconds = time.perf_counter() - t
    target.unlink(missing_ok=True)
    # tmpfs (TMPDIR=/dev/shm: the build without a disk under it) has no O_DIRECT: no rate to compare
    return gib * (1 << 30) / seconds / 1e6 if done.returncode == 0 else float("nan")


def _faster(best: dict, got: dict) -> dict:
    """Of two reps' Utilization.steady() figures, those of the faster one."""
    return got if got.get("rate", 0.0) > best.get("rate", 0.0) else best


def _rate_rows(what, wall: float, steady: dict, workers: int) -> list[dict]:
    """A build setting's two rows: its wall rate (start-up included) and its steady 20-90% rate with the
    utilization over those seconds; what(suffix) names a row."""
    extra = dict(steady)
    rate = extra.pop("rate", 0.0)
    return [{"what": what(""), "img/s": wall, "img/s/core": wall / workers},
            {"what": what(", steady 20-90%"), "img/s": rate, "img/s/core": rate / workers, **extra}]


def gpu_rows(src: Path, tmp: Path, size: int, workers: int,
             only: list[str] | None = None, encode: str = "raw") -> tuple[list[dict], str]:
    """build-cache --decoder nvjpeg in each GPU_VARIANTS setting (or `only` those), alternating, two reps after a
    warm-up build. Per variant: the wall rate (start-up included) and the steady rate between 20% and 90% of the
    images (Utilization.steady), each the better of the two reps. W is --workers (default: every usable CPU)."""
    from fastdata.cache.build import BuildConfig, build_cache
    from fastdata.cache.gpu_build import process_split

    def one(dest: str, **kw):
        r = build_cache(BuildConfig(src=str(src), dest=str(tmp / dest), size=size, progress=False, decoder="nvjpeg",
                                    encode=encode, **kw))
        shutil.rmtree(tmp / dest, ignore_errors=True)   # (the disk holds the next one)
        return r

    variants = {k: v for k, v in GPU_VARIANTS.items() if not only or k in only}
    one("gpu-warm", part=(0, 20), workers=0)
    wall: dict[str, float] = {}
    steady: dict[str, dict] = {}
    labels: dict[str, str] = {}
    saved = {k: os.environ.get(k) for k in ("FASTDATA_BUILD_ENGINES", "FASTDATA_BUILD_CPU_PROCESSES")}
    for k in range(2):
        for j, (name, (env, processes)) in enumerate(variants.items()):
            os.environ.update(env)
            n = processes(workers)
            labels[name] = f"{name} ({'%d GPU + %d CPU processes' % process_split(n) if n else 'threads'})"
            with Utilization() as u:
                full = one(f"gpu-{k}-{j}", workers=n)
            wall[name] = max(wall.get(name, 0.0), full.written / full.seconds)
            steady[name] = _faster(steady.get(name, {}), u.steady(full.written))
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    rows = []
    for name, rate in wall.items():
        rows += _rate_rows(lambda s, label=labels[name]: f"build-cache --encode {encode} --decoder nvjpeg ({label}{s})",
                           rate, steady[name], workers)
    return rows, _gpu_pixels(src, tmp, size)


def _gpu_pixels(src: Path, tmp: Path, size: int) -> str:
    """The engines' pixels against the CPU build's (c-raw-0), where the CPU rows ran."""
    from fastdata.cache.build import BuildConfig, build_cache

    if not (tmp / "c-raw-0").exists():
        return ""
    os.environ["FASTDATA_BUILD_ENGINES"] = "1"
    build_cache(BuildConfig(src=str(src), dest=str(tmp / "gpu-pixels"), size=size, progress=False, decoder="nvjpeg",
                            workers=0))
    os.environ.pop("FASTDATA_BUILD_ENGINES")
    mean, worst = pixel_difference(tmp / "c-raw-0", tmp / "gpu-pixels")
    return (f" --decoder nvjpeg (threads, engines) against the CPU build of the same files: mean absolute "
            f"difference {mean:.2f} of 255 levels, worst image {worst:.2f}.")


def _source(tmp: Path, a) -> tuple[Path, list[Path]]:
    """The photo folder (its classes hard-linked a.copies times), every file read once so that every row
    reads from the page cache."""
    from fastdata.sample import make_image_folder

    src = make_image_folder(tmp / "src", a.per_class, photos_dir=a.photos)
    for c in sorted(src.iterdir()) if a.copies > 1 else ():
        for k in range(1, a.copies):
            (src / f"{c.name}-copy{k}").mkdir()
            for p in c.iterdir():
                os.link(p, src / f"{c.name}-copy{k}" / p.name)
    files = sorted(src.rglob("*.jpg"))
    for p in files:
        p.read_bytes()
    return src, files


def _cpu_rows(src: Path, tmp: Path, sub: list, size: int, encode: str, workers: int) -> list[dict]:
    """The codec's one-process rate and the CPU build's rows (best of two: this VM's CPU speed varies)."""
    from fastdata.cache.build import BuildConfig, build_cache

    own = max(codec_rate(sub, size, encode) for _ in range(2))
    rate, steady = 0.0, {}
    for rep in range(2):
        with Utilization() as u:
            res = build_cache(BuildConfig(src=str(src), dest=str(tmp / f"c-{encode}-{rep}"), encode=encode,
                                          size=size, workers=workers, progress=False))
        rate = max(rate, res.written / res.seconds)
        steady = _faster(steady, u.steady(res.written))
    rows = [{"what": f"fastdata codec ({encode}), 1 process", "img/s": own, "img/s/core": own}]
    return rows + _rate_rows(lambda s: f"build-cache --encode {encode}, {workers} workers{s}", rate, steady, workers)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=60)
    ap.add_argument("--copies", type=int, default=1,
                    help="hard-link the folder's classes this many times: a build long enough that the processes' "
                         "start-up does not swamp the rate after it, without generating more images")
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--photos", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--gpu-only", action="store_true", help="leave out the CPU builds (the plain rate stays)")
    ap.add_argument("--cpu-encodes", default="raw,jpeg", help="the CPU builds' --encode values, comma separated")
    ap.add_argument("--gpu-encode", default="raw", choices=("raw", "jpeg"), help="--encode of the GPU builds")
    ap.add_argument("--variants", default=None, help="GPU_VARIANTS names separated by ; (default: all)")
    a = ap.parse_args()
    from fastdata._util import usable_cpus

    workers = a.workers or usable_cpus()
    tmp = Path(tempfile.mkdtemp(prefix="fastdata-bench-"))
    try:
        src, files = _source(tmp, a)
        sub = files[:: max(1, len(files) // 800)]
        plain = max(plain_pil_rate(sub, a.size) for _ in range(2))
        rows = [{"what": "plain PIL decode+resize, 1 process, before the builds", "img/s": plain, "img/s/core": plain}]
        for encode in () if a.gpu_only else a.cpu_encodes.split(","):
            rows += _cpu_rows(src, tmp, sub, a.size, encode, workers)
        gpu_note = ""
        if gpu_decoder_ok():
            only = a.variants.split(";") if a.variants else None
            extra, gpu_note = gpu_rows(src, tmp, a.size, workers, only, encode=a.gpu_encode)
            rows += extra
        after = max(plain_pil_rate(sub, a.size) for _ in range(2))
        rows.insert(1, {"what": "plain PIL decode+resize, 1 process, after the builds", "img/s": after,
                        "img/s/core": after})
        plain = max(plain, after)   # this VM's single-core speed moves between minutes: the stricter of the two
        disk = disk_write_rate(tmp)
        for r in rows:
            if r["what"].startswith("build-cache"):
                r["vs plain x workers"] = f"{r['img/s'] / (plain * workers):.0%}"
                if "--encode raw" in r["what"]:
                    r["MB/s written"] = round(r["img/s"] * a.size * a.size * 3 / 1e6)
        variants_arg = f' --variants "{a.variants}"' if a.variants else ""
        notes = (f"{len(files)} JPEGs ({len(files) // a.copies} distinct) of 500x375 (q90) made from skimage/sklearn photos; size {a.size}, "
                 f"h5 shards, page cache warm, best of two runs per row; 'vs plain x workers' uses the higher of the plain rates "
                 f"measured before and after the builds. Rows 'steady 20-90%': the rate between 20% and 90% "
                 f"of the images done, read from the build's progress counter every 0.25 s (start-up s: until the first "
                 f"image was done), with the CPU busy and NVML GPU / JPEG-engine utilization over those seconds. Goal (issue 21): build >= 150% of plain-PIL rate x cores. "
                 f"MB/s written: a raw row's pixel bytes a second, against the disk's dd oflag=direct write rate "
                 f"measured after the builds, {disk:,.0f} MB/s (each shard is fsynced; sources and caches under "
                 f"{tmp.parent}: TMPDIR=/dev/shm takes the disk out). The codec uses "
                 f"libjpeg DCT-domain downscaling (PIL draft), which is why it beats plain PIL per core."
                 f"{gpu_note} Rerun: `python benchmarks/build.py --per-class {a.per_class} --copies {a.copies} --size {a.size}"
                 f"{' --gpu-only' if a.gpu_only else f' --cpu-encodes {a.cpu_encodes}'}"
                 f"{f' --gpu-encode {a.gpu_encode}' if a.gpu_encode != 'raw' else ''}"
                 f"{variants_arg}`.")
        write("build", rows, ["what", "img/s", "img/s/core", "vs plain x workers", "MB/s written", "start-up s", "to 20% s",
                        "20-90% s", "90-100% s", "CPU busy", "GPU util", "JPG util"], notes,
              Path(a.out) if a.out else None)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
