"""`fastdata plan SRC` (and `build-cache --dry-run`): cache sizes and build time from a sample of the inputs.

A few hundred inputs, spread evenly over SRC, are decoded with the build's own codec at the chosen
size, to measure: bytes per sample for a raw and a JPEG cache, the decode rate per core, and the
share that would be quarantined. Scaled to the whole input list and compared with this machine's
RAM and DEST's free disk, they give a recommendation and the reason for it:

  raw    the raw cache fits in half the memory: it is read at memory speed (the fastest path);
  jpeg   raw would not fit in memory but the ~10x smaller JPEG cache does: decode on the GPU;
  raw, streamed   neither fits in memory: a raw cache on disk is streamed at the disk's rate;
  smaller size    nothing fits on DEST's disk at this size.
"""
from __future__ import annotations

import io
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .._util import human_bytes, memory_total, usable_cpus
from .codecs import CodecConfig, check_codec, process_bytes
from .sources import Item, read_item

SAMPLE = 200


@dataclass(frozen=True)
class Plan:
    inputs: int
    sampled: int
    bad_share: float
    raw_bytes: int
    jpeg_bytes: int
    input_bytes: int
    rate_per_core: float
    cores: int
    ram: int
    free_disk: int
    choice: str
    reason: str
    note: str = ""     # upscale_note(): inputs far smaller than the target size

    def text(self) -> str:
        t = self.inputs / max(1e-9, self.rate_per_core * self.cores)
        lines = [
            f"{self.inputs} inputs ({human_bytes(self.input_bytes)}); measured on {self.sampled} of them"
            f"{f', {self.bad_share:.0%} undecodable' if self.bad_share else ''}",
            f"  raw cache   {human_bytes(self.raw_bytes):>10}   (RAM {human_bytes(self.ram)}, "
            f"free disk {human_bytes(self.free_disk)})",
            f"  jpeg cache  {human_bytes(self.jpeg_bytes):>10}",
            f"  build       ~{t / 60:.1f} min on {self.cores} cores ({self.rate_per_core:.0f} img/s per core)",
            f"recommended: {self.choice}: {self.reason}",
        ] + ([f"note: {self.note}"] if self.note else [])
        return "\n".join(lines)


def _measure(items, codec: CodecConfig, options) -> tuple[float, float, float, float, int, list[int]]:
    """(raw bytes, jpeg bytes, input bytes per good sample, seconds per decode, bad count, short sides)
    on the sample, each input read once (from object storage a read is a paid request)."""
    raw = jpeg = src = seconds = 0.0
    good = bad = 0
    sides: list[int] = []
    for it in items:
        try:
            data = read_item(it, options)
        except OSError:
            bad += 1
            continue
        side = _short_side(data)
        sides += [side] if side else []
        t0 = time.perf_counter()
        res = process_bytes(data, codec)
        seconds += time.perf_counter() - t0
        if isinstance(res, str):
            bad += 1
            continue
        good += 1
        raw += res[1][0] * res[1][1] * 3
        jres = process_bytes(data, CodecConfig("jpeg", codec.size, codec.resize, codec.quality))
        jpeg += len(jres[0]) if not isinstance(jres, str) else 0
        src += len(data)
    n = max(1, good)
    return raw / n, jpeg / n, src / n, seconds / max(1, good + bad), bad, sides


def _short_side(data: bytes) -> int | None:
    """An input's short side in pixels from its header (no decode), or None where PIL cannot tell."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return min(img.size)
    except Exception:  # noqa: BLE001 - unreadable inputs are the build's to quarantine
        return None


def short_sides(items, options: dict | None = None, n: int = 32) -> list[int]:
    """The short side, in pixels, of up to n inputs spread over items, from their headers (no decode)."""
    sides = []
    for it in items[::max(1, len(items) // n)][:n]:
        try:
            side = _short_side(read_item(it, options))
        except Exception:  # noqa: BLE001 - a warning's helper never stops a build; the build names the input
            continue
        sides += [side] if side else []
    return sides


def upscale_note(sides: list[int], size: int) -> str:
    """A warning where most inputs are under half the target size: the cache would hold upscaled
    pixels, (size / median)^2 times as many, with no detail gained (CIFAR's 32 px at the default 256)."""
    if not sides:
        return ""
    median = sorted(sides)[len(sides) // 2]
    if median * 2 > size:
        return ""
    return (f"most inputs are far smaller than --size {size} (median short side {median} px): they would be "
            f"upscaled, making the cache ~{(size / median) ** 2:.0f}x larger with no detail gained; "
            f"consider --size {median}")


def _choose(raw: int, jpeg: int, ram: int, disk: int, size: int) -> tuple[str, str]:
    if raw <= ram // 2 and raw <= disk:
        return "raw", f"the raw cache ({human_bytes(raw)}) fits in half of RAM: reads run at memory speed"
    if jpeg <= ram // 2 and jpeg <= disk:
        return ("jpeg", f"raw ({human_bytes(raw)}) exceeds half of RAM ({human_bytes(ram // 2)}) but the JPEG cache "
                        f"({human_bytes(jpeg)}) fits: build with --encode jpeg and decode on the GPU (DALI/nvJPEG)")
    if raw <= disk:
        return ("raw, streamed", f"no cache fits in RAM; raw ({human_bytes(raw)}) fits on disk and the loader "
                                 f"streams it at the disk's rate (fastdata.loader memory='auto')")
    smaller = int(size * (disk / max(1, raw)) ** 0.5 * 0.9)
    return (f"--size {smaller}", f"raw ({human_bytes(raw)}) and even JPEG ({human_bytes(jpeg)}) exceed the free "
                                 f"disk ({human_bytes(disk)}); a smaller size or another DEST is needed")


def plan(items: tuple[Item, ...], codec: CodecConfig, dest: str | None, options: dict | None = None) -> Plan:
    from .jobs import _tune_malloc

    check_codec(codec)
    _tune_malloc()   # decode as fast as a build job does, or the per-core rate is understated
    step = max(1, len(items) // SAMPLE)
    sample = items[::step][:SAMPLE]
    raw, jpeg, src, per, bad, sides = _measure(sample, codec, options)
    good_share = 1 - bad / max(1, len(sample))
    n_good = int(len(items) * good_share)
    where = Path(dest).parent if dest and not str(dest).startswith("s3://") else Path.cwd()
    while not where.exists() and where != where.parent:
        where = where.parent
    disk = shutil.disk_usage(where).free
    ram = memory_total()
    raw_total, jpeg_total = int(raw * n_good), int(jpeg * n_good)
    choice, reason = _choose(raw_total, jpeg_total, ram, disk, codec.size)
    note = upscale_note(sides, codec.size) if codec.resize in ("fixed", "short") else ""
    return Plan(len(items), len(sample), 1 - good_share, raw_total, jpeg_total, int(src * len(items)),
                1 / max(per, 1e-9), usable_cpus(), ram, disk, choice, reason, note)
