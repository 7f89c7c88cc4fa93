"""Build decoding on the GPU (``build-cache --decoder nvjpeg``): a shard's JPEGs are decoded by nvJPEG
in batches, turned by their EXIF orientation, cropped and resized on the GPU; every other input
(PNG, CMYK or 12-bit JPEG, a batch nvJPEG refuses) goes through the CPU codec, which also quarantines.

Why: on the H200 machine's 16 vCPUs a PIL build of 500x375 JPEGs ran at 3.7k img/s, 0.53x of 16 x
the single-process rate (benchmarks/results/build-H200-2026-12-04.md): the vCPUs are hyperthreads
and full-size decoding dominates. The GPU's JPEG engines decode ~25k small images a second
(decode.py), so the build becomes bound by reading files and writing shards. Shards are built in
`--workers` processes (process_split, gpu_map), each with its own decoder (in one process, torchvision's
decode calls queue behind one mutex: build-H100-80GB-HBM3-2026-12-06-processes{8,16}.md); some of them
build with the CPU codec instead, using the CPU time that the GPU ones leave idle.

The pixels are not the CPU codec's: nvJPEG's IDCT and chroma upsampling differ from libjpeg's, the
CPU codec decodes at a reduced DCT scale where it can (codecs.py draft), and a crop box is rounded
to whole pixels here. benchmarks/build.py reports the difference; tests/gpu bound it.
"""
from __future__ import annotations

import contextlib
import io
import logging
import os
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import torch

from ..errors import BuildError
from . import jobs
from .codecs import CodecConfig, _target, oversized, process_bytes
from .jpeg_header import jpeg_frame
from .format import shard_name
from .writers import WRITERS

log = logging.getLogger("fastdata.build")

BATCH = 128             # images per nvJPEG call
DECODE_PIXELS = 1 << 27  # decoded pixels per nvJPEG call (~400 MB of RGB; a shard thread holds one call's)
GROUP_PIXELS = 1 << 26  # source pixels per batched resize: its float copy stays under 1 GB (3 x 4 bytes each)
READ_THREADS = 8        # a shard's next batch of file reads; as many threads again for CRCs and JPEG encodes
# shards built at once: one shard alone left the GPU and the disk idle in turn (read, decode, copy
# back, hash, fsync): 1.1k img/s on the H200 against 2.6k for the 16-process CPU build
SHARD_THREADS = 6

# EXIF orientation -> the transform PIL's exif_transpose applies, on a (C, H, W) tensor
_ORIENT = {
    2: lambda x: x.flip(2),                                  # FLIP_LEFT_RIGHT
    3: lambda x: x.flip(1).flip(2),                          # ROTATE_180
    4: lambda x: x.flip(1),                                  # FLIP_TOP_BOTTOM
    5: lambda x: x.transpose(1, 2),                          # TRANSPOSE
    6: lambda x: torch.rot90(x, -1, (1, 2)),                 # ROTATE_270 (a quarter clockwise)
    7: lambda x: x.transpose(1, 2).flip(1).flip(2),          # TRANSVERSE
    8: lambda x: torch.rot90(x, 1, (1, 2)),                  # ROTATE_90 (a quarter anticlockwise)
}


def check_gpu_decoder() -> None:
    """A one-line BuildError where --decoder nvjpeg cannot run."""
    if not torch.cuda.is_available():
        raise BuildError("--decoder nvjpeg needs a CUDA GPU; leave it out to decode with PIL on the CPU")
    try:
        import torchvision.io  # noqa: F401
    except Exception as e:  # noqa: BLE001 - missing, or a build that does not match this torch
        raise BuildError(f"--decoder nvjpeg needs torchvision with CUDA ({e}); pip install torchvision "
                         f"matching torch {torch.__version__}, or leave --decoder out") from None


def nvjpeg_decode(datas: list[bytes], device: str = "cuda") -> list[torch.Tensor]:
    """JPEG bytes -> (3, H, W) uint8 tensors on the GPU, as stored (no EXIF orientation)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    encoded = [torch.frombuffer(bytearray(d), dtype=torch.uint8) for d in datas]   # (bytes are read-only)
    return decode_jpeg(encoded, mode=ImageReadMode.RGB, device=device)


def _nvjpeg_can(frame) -> bool:
    """Whether nvJPEG decodes this jpeg_frame as PIL would (8-bit, grey or 3 components, a known turn)."""
    return frame is not None and frame[3] == 8 and frame[2] in (1, 3) and 1 <= frame[4] <= 8


def gpu_decodable(data: bytes) -> int | None:
    """The EXIF orientation of a JPEG nvJPEG decodes as PIL would, else None."""
    frame = jpeg_frame(data)
    return frame[4] if _nvjpeg_can(frame) else None


def _by_pixels(entries: list) -> list[list]:
    """(index, jpeg_frame) entries in runs of at most DECODE_PIXELS decoded pixels (one image over it
    alone): six shard threads each decoding 128 twelve-megapixel phone photos held 28 GB of GPU memory."""
    runs: list[list] = []
    total = DECODE_PIXELS + 1
    for entry in entries:
        px = entry[1][0] * entry[1][1]
        if total + px > DECODE_PIXELS:
            runs.append([])
            total = 0
        runs[-1].append(entry)
        total += px
    return runs


def upright(x: torch.Tensor, orientation: int) -> torch.Tensor:
    """(C, H, W) as stored -> turned as PIL's exif_transpose turns it (a view; 1 or unknown: x itself).
    nvJPEG, through torchvision or our binding, ignores EXIF orientation on the GPU."""
    return _ORIENT[orientation](x) if orientation in _ORIENT else x


def _crop_like_codec(x: torch.Tensor, orientation: int, codec: CodecConfig) -> tuple[torch.Tensor, tuple]:
    """(3, H, W) as decoded -> (upright crop as a view, (oh, ow) to resize it to), as codecs.decode
    crops (the box rounded to whole pixels)."""
    x = upright(x, orientation)
    h, w = x.shape[1], x.shape[2]
    (ow, oh), (left, top, right, bottom) = _target(w, h, codec)
    l, t = int(round(left)), int(round(top))
    x = x[:, t:t + max(1, int(round(bottom - top))), l:l + max(1, int(round(right - left)))]
    return x, (oh, ow)


def _resize(x: torch.Tensor, size: tuple) -> torch.Tensor:
    """(N, 3, h, w) uint8 -> (N, oh, ow, 3) uint8, antialiased bilinear as PIL's BILINEAR when shrinking."""
    if (x.shape[2], x.shape[3]) != tuple(size):
        x = torch.nn.functional.interpolate(x.float(), size=size, mode="bilinear", antialias=True,
                                            align_corners=False).round_().clamp_(0, 255).to(torch.uint8)
    return x.permute(0, 2, 3, 1)


def resize_like_codec(x: torch.Tensor, orientation: int, codec: CodecConfig) -> torch.Tensor:
    """(3, H, W) uint8 as decoded -> (h, w, 3) uint8 upright, cropped and resized as codecs.decode does
    (the box rounded to whole pixels; antialiased bilinear, as PIL's BILINEAR when shrinking)."""
    crop, size = _crop_like_codec(x, orientation, codec)
    return _resize(crop[None], size)[0]


def resize_all_like_codec(images: list, orientations: list, codec: CodecConfig) -> list[torch.Tensor]:
    """resize_like_codec over a batch, with one resize per group of crops of the same size (photos share
    a few sizes: 500x375, 375x500, ...): a resize per image cost ~8 kernel launches and their Python
    dispatch, under the GIL that the build's shard threads share."""
    crops = [_crop_like_codec(x, o, codec) for x, o in zip(images, orientations)]
    groups: dict[tuple, list[int]] = {}
    for i, (crop, size) in enumerate(crops):
        groups.setdefault((crop.shape[1], crop.shape[2], size), []).append(i)
    out: list = [None] * len(crops)
    for (h, w, size), members in groups.items():
        per_call = max(1, GROUP_PIXELS // (h * w))   # bounds the float copy: 12 MP phone photos, 128 a batch
        for lo in range(0, len(members), per_call):
            part = members[lo:lo + per_call]
            resized = _resize(torch.stack([crops[i][0] for i in part]), size).contiguous()   # (one copy back)
            for k, i in enumerate(part):
                out[i] = resized[k]
    return out


def _payloads(images: list[torch.Tensor], codec: CodecConfig, pool) -> list[tuple[bytes, tuple, int]]:
    """GPU images -> (payload, shape, crc32) each, with one copy to the host for the batch."""
    flat = torch.cat([im.reshape(-1) for im in images]).cpu().numpy()
    ends = np.cumsum([im.numel() for im in images])
    arrays = [flat[e - im.numel():e].reshape(im.shape) for im, e in zip(images, ends)]

    def one(a: np.ndarray):
        if codec.encode == "jpeg":
            from PIL import Image

            buf = io.BytesIO()
            Image.fromarray(a).save(buf, format="JPEG", quality=codec.quality)
            payload = buf.getvalue()
        else:
            payload = a.tobytes()
        return payload, a.shape, zlib.crc32(payload)
    return list(pool.map(one, arrays))


def _decode_split(datas: list, decode) -> list:
    """decode() over the batch; where nvJPEG refuses it (one bad file fails the whole call), over each
    half in turn, down to single images: None for each image it refuses."""
    try:
        return list(decode(datas))
    except RuntimeError:
        if len(datas) == 1:
            return [None]
        mid = len(datas) // 2
        return _decode_split(datas[:mid], decode) + _decode_split(datas[mid:], decode)


def decode_batch(datas: list, codec: CodecConfig, pool, decode=nvjpeg_decode) -> list:
    """Inputs (bytes, or a reason they could not be read) -> (payload, shape, crc32) or a reason each.
    What nvJPEG cannot or will not decode goes through the CPU codec, which decodes or names it."""
    out: list = [d if isinstance(d, str) else None for d in datas]
    # the rest, oversized outputs included, go through the CPU codec, which builds them or names the reason
    gpu = [(i, frame) for i, d in enumerate(datas) if not isinstance(d, str)
           for frame in [jpeg_frame(d)] if _nvjpeg_can(frame) and not oversized(frame[1], frame[0], codec)]
    for part in _by_pixels(gpu):
        decoded = _decode_split([datas[i] for i, _ in part], decode)
        done = [(i, x, f[4]) for x, (i, f) in zip(decoded, part) if x is not None]
        if done:
            resized = resize_all_like_codec([x for _, x, _ in done], [o for _, _, o in done], codec)
            for (i, _, _), res in zip(done, _payloads(resized, codec, pool)):
                out[i] = res
    rest = [i for i, r in enumerate(out) if r is None]
    for i, res in zip(rest, pool.map(lambda i: process_bytes(datas[i], codec), rest)):
        out[i] = res
    return out


def _read(item, options: dict | None):
    """jobs.read_input, with a storage error returned (for the input it belongs to) instead of raised."""
    try:
        return jobs.read_input(item, options)
    except Exception as e:  # noqa: BLE001 - named by build_shard_gpu with its input
        return e


def _own_stream():
    """This shard's GPU work on a stream of its own. On the legacy default stream, which every shard thread
    shares, each thread's copy back waited for all the others' decodes and resizes: the engines' calls,
    queued there rather than on torchvision's private stream, built at 0.55x of the torchvision path
    (build-H100-80GB-HBM3-2026-12-05-engines-default-stream.md)."""
    return torch.cuda.stream(torch.cuda.Stream()) if torch.cuda.is_available() else contextlib.nullcontext()


def build_shard_gpu(task, decode=None) -> tuple[int, object, list[dict], str | None]:
    """jobs.build_shard with the decoding on the GPU: same task, same result, same quarantine rules.
    decode: batch decoder (default nvjpeg_decode, looked up per call)."""
    decode = decode or nvjpeg_decode
    index, items, codec, fmt, dest, on_error, *store = task
    dest_url, options = store[0] if store else (None, None)
    writer = WRITERS[fmt](Path(dest) / shard_name(index, fmt))
    quarantined: list[dict] = []
    batches = [items[lo:lo + BATCH] for lo in range(0, len(items), BATCH)]
    with _own_stream(), ThreadPoolExecutor(READ_THREADS, thread_name_prefix="fastdata-build-read") as reads, \
            ThreadPoolExecutor(READ_THREADS, thread_name_prefix="fastdata-build-cpu") as pool:
        def read(batch):        # (an empty slice past the last batch reads nothing)
            return [reads.submit(_read, it, options) for it in batch]

        ahead = read(items[:BATCH])
        for b, chunk in enumerate(batches):
            datas = [f.result() for f in ahead]
            # the next batch's files are read while this one decodes, copies back and is hashed
            ahead = read(items[(b + 1) * BATCH:(b + 2) * BATCH])
            for item, data in zip(chunk, datas):
                if isinstance(data, Exception):   # storage trouble stops the build, naming the input
                    from ..stores.s3 import storage_error

                    return index, None, [], str(storage_error(data, item.path, "reading an input"))
            try:
                results = decode_batch(datas, codec, pool, decode)
            except torch.OutOfMemoryError as e:   # (nvJPEG's own calls split themselves: _decode_split)
                return index, None, [], (f"the GPU ran out of memory on shard {index} near {chunk[0].path} "
                                         f"({str(e).splitlines()[0][:120]}); free GPU memory (another "
                                         f"process on it?) and rerun to resume, with fewer --workers (each "
                                         f"has its own GPU context), or leave --decoder out")
            for item, res in zip(chunk, results):
                error = jobs.take(writer, quarantined, item, res, on_error)
                if error:
                    return index, None, [], error
            jobs.report_progress(len(chunk))
    return jobs._finish(index, writer, quarantined, dest, dest_url, options)


def _torchvision(datas: list) -> list[torch.Tensor]:
    return nvjpeg_decode(datas)          # (looked up per call: the CPU tests stand a decoder in)


def engine_decode():
    """The shard decoder: gpu_engines.EngineDecode on this GPU where FASTDATA_BUILD_ENGINES=1, else None
    (torchvision's). Opt-in: with a stream per shard it built at 0.96x of the torchvision path in threads
    (build-H100-80GB-HBM3-2026-12-06.md) and 0.93x in 16 processes (-processes16.md)."""
    from .gpu_engines import EngineDecode

    if os.environ.get("FASTDATA_BUILD_ENGINES") != "1" or not torch.cuda.is_available():
        return None
    return EngineDecode(torch.device("cuda"), _torchvision)


PROCESS_GPU_BYTES = 3 << 30   # GPU memory one shard process may take: a CUDA context (~0.5 GB), one nvJPEG
                              # call's decoded pixels (DECODE_PIXELS x 3 B) and one resize group's floats


def shard_processes(workers: int) -> int:
    """Shard processes for --decoder nvjpeg: `workers`, at most as many as the GPU's free memory holds
    (PROCESS_GPU_BYTES each); 0 means shard threads in this process. Why processes: torchvision's decode
    calls are serialised by one mutex per process (py-spy on the H100 host found the shard threads waiting on
    it, pyspy-gpubuild-H100-2026-12-05-summary.txt). After start-up, 8 processes built 1.6x what the threads
    did, 16 processes 1.19x of 16 x plain PIL (build-H100-80GB-HBM3-2026-12-06-processes{8,16}.md)."""
    if workers <= 0 or not torch.cuda.is_available():
        return max(0, workers)
    return max(1, min(workers, free_gpu_bytes() // PROCESS_GPU_BYTES))


def free_gpu_bytes() -> int:
    """Free memory of CUDA device 0, from NVML: torch.cuda.mem_get_info would open a CUDA context in this
    process, ~0.5 GB of the GPU that the shard processes then lack for the whole build."""
    try:
        import pynvml as nv

        from ..monitor.nvml import nvml_handle

        nv.nvmlInit()
        return int(nv.nvmlDeviceGetMemoryInfo(nvml_handle(nv, 0)).free)
    except Exception:  # noqa: BLE001 - no NVML (a container without the library): ask CUDA
        return int(torch.cuda.mem_get_info()[0])


_worker_decode = None   # this process's batch decoder; CPU_ROLE: it builds with the CPU codec instead
CPU_ROLE = "cpu"


CPU_SHARE = (3, 8)   # by default 3 build processes in 8 decode with the CPU codec (process_split)


def process_split(workers: int) -> tuple[int, int]:
    """(GPU, CPU) shard processes for --decoder nvjpeg --workers N, all taking shards from one queue:
    FASTDATA_BUILD_CPU_PROCESSES of them (default 3N/8, rounded down) build with the CPU codec, the rest decode
    on the GPU, as many as its free memory holds (shard_processes), and the CPU codec takes any they leave.
    Why a mix: a GPU shard process works through its shard serially (read, decode, copy back, hash, write) and
    leaves much of a core idle, and the GPU's decoders were never the limit (NVML: JPEG engines 16-31% busy).
    Rates between 20% and 90% of one 45,000-image build, two calls on one H100 host (16 CPUs):
    10 GPU + 6 CPU 8,213 and 8,593 img/s; 16 + 0 7,681; 12 + 4 7,343; 8 + 8 7,689; more processes than cores
    did not help (18 + 6 8,825, 16 + 8 7,377, 23 + 9 5,442). The CPU processes also build while the GPU ones
    start (their CUDA contexts: 13 s before a 16 + 0 build wrote its first image, 0.5 s with CPU processes).
    (build-H100-80GB-HBM3-2026-12-06-{steady,oversubscribed}.md.) workers=0: (0, 0), shard threads here."""
    if workers <= 0:
        return 0, 0
    raw = os.environ.get("FASTDATA_BUILD_CPU_PROCESSES", "")
    try:
        cpu = int(raw) if raw.strip() else workers * CPU_SHARE[0] // CPU_SHARE[1]
    except ValueError:
        raise BuildError(f"FASTDATA_BUILD_CPU_PROCESSES={raw!r}: give a whole number of build processes that "
                         f"decode on the CPU, or unset it") from None
    gpu = shard_processes(workers - min(max(0, cpu), workers - 1))
    return gpu, workers - gpu


def _init_gpu_worker(counter, decode, roles=None, gpu: int = 0) -> None:
    """A build process of gpu_map: the build worker's signals and progress counter, then its role, taken in
    start order from the shared `roles` count: the first `gpu` decode on the GPU (the engines where
    FASTDATA_BUILD_ENGINES=1, else `decode`: nvjpeg_decode, or the CPU tests' stand-in), the rest with the
    CPU codec (and never touch CUDA)."""
    global _worker_decode
    jobs._init_worker(counter)
    if roles is not None:
        with roles.get_lock():
            role, roles.value = roles.value, roles.value + 1
        if role >= gpu:
            _worker_decode = CPU_ROLE
            return
    _worker_decode = engine_decode() or decode


def _worker_shard(task):
    if _worker_decode == CPU_ROLE:
        return jobs.build_shard(task)
    return build_shard_gpu(task, _worker_decode)


@contextlib.contextmanager
def gpu_map(workers: int):
    """Where --decoder nvjpeg's shard jobs run: `workers` processes (not forked from this one: a child of a
    process that has touched CUDA cannot use it), each building one shard at a time, split by process_split into
    GPU ones (each with its own CUDA context) and CPU-codec ones, all taking shards from one queue; or,
    for workers=0, gpu_shard_map's threads in this process. Yields (run, counter), as executors.shard_map."""
    import multiprocessing as mp

    from .executors import process_map, progress_counter

    gpu, cpu = process_split(workers)
    if not gpu:
        counter = progress_counter()
        with gpu_shard_map(counter) as run:
            yield run, counter
        return

    # forked from a server process that imported these once and never touched CUDA (its first start is a
    # spawn), rather than each worker spawned and importing torch itself
    mp.set_forkserver_preload(["fastdata.cache.gpu_build", "torchvision.io"])
    counter, roles = progress_counter("forkserver"), mp.get_context("forkserver").Value("i", 0)
    log.info("build processes: %d decode on the GPU, %d on the CPU", gpu, cpu)
    with process_map(gpu + cpu, counter, _worker_shard, start="forkserver", init=_init_gpu_worker,
                     init_args=(counter, nvjpeg_decode, roles, gpu)) as run:
        yield run, counter


@contextlib.contextmanager
def gpu_shard_map(counter):
    """executors.shard_map for --decoder nvjpeg --workers 0: SHARD_THREADS shard jobs at once in this process
    (one CUDA context), decoding through torchvision's calls (which one mutex serialises), or, with
    FASTDATA_BUILD_ENGINES=1, on the NVJPG engines with a decoder per thread where they take the images
    (engine_decode, gpu_engines.py). Results in completion order."""
    jobs._init_worker(counter)
    pool = ThreadPoolExecutor(SHARD_THREADS, thread_name_prefix="fastdata-build-gpu")
    engines = engine_decode()

    def run(tasks):
        futures = [pool.submit(build_shard_gpu, t, engines) for t in tasks]
        for fut in as_completed(futures):
            yield fut.result()
    try:
        yield run
    finally:
        pool.shutdown(wait=True, cancel_futures=True)   # a failed build waits only for running shards
        if engines is not None:
            engines.close()
            log.info("decoded on the NVJPG engines: %d; by torchvision: %d%s", engines.decoded["hardware"],
                     engines.decoded["fallback"], f" ({engines.why})" if not engines.decoded["hardware"] else "")
