"""LoaderConfig: the one configuration of fastdata.loader, with a nested config for its backend.

The settings every backend shares sit on LoaderConfig; what only some
backends understand sits in their own options class. Keyword arguments that
fastdata.loader() receives are sorted into the two here, so an option the
chosen backend does not take is a LoaderError naming the backends that do,
rather than a dataclass TypeError or an option silently ignored.

threads and prefetch default to None: each backend's own measured default
(BACKEND_DEFAULTS), because a reader thread means different work in each
(a memory gather, a PIL decode, a DALI CPU thread) and DALI's prefetch is
its own queue depth.
"""
from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field

from ..errors import LoaderError
from .augment import AugmentConfig
from .integrity import check_mode

BACKENDS = ("raw", "pil", "nvjpeg", "dali")

# (threads, prefetch) per backend, as each was tuned (benchmarks/loader.py, decode.py, dali_limits.py)
BACKEND_DEFAULTS = {"raw": (4, 6), "pil": (8, 4), "nvjpeg": (8, 4), "dali": (4, 2)}


@dataclass(frozen=True, kw_only=True)
class RawOptions:
    """Backend raw: uint8 pixels gathered from a raw cache (fill.py, gather.py)."""

    window: int = 16384                 # samples shuffled together (spans several shards)
    read: str = "mmap"                  # mmap (one gather per shard) | pread (see fill.py)
    integrity: str = "shard"            # shard | sample | off: checks on read (integrity.py)
    # streaming reads of caches bigger than memory (stream.py): "auto" turns them on when the cache
    # exceeds half the memory budget; a size ("8GB") forces them with that budget; None: never
    memory: str | int | None = "auto"
    remote: object = None               # stores.fetch.RemoteConfig for an s3:// cache
    # a tmpfs folder (e.g. "/dev/shm/imagenet") to copy a local cache into first and read from
    # (cache/stage.py: skipped with a warning when it would not fit; reused when already there)
    stage: str | None = None

    def check(self) -> None:
        check_mode(self.integrity)
        if self.read not in ("mmap", "pread"):
            raise LoaderError(f"read={self.read!r}: choose mmap or pread")


@dataclass(frozen=True, kw_only=True)
class DecodeOptions:
    """Backend pil: JPEG files or a JPEG cache, decoded per batch by PIL in the reader threads."""

    integrity: str = "shard"            # for a JPEG cache, as in RawOptions

    def check(self) -> None:
        check_mode(self.integrity)


@dataclass(frozen=True, kw_only=True)
class NvjpegOptions:
    """Backend nvjpeg: JPEG files or a JPEG cache, decoded per batch on the GPU."""

    integrity: str = "shard"            # for a JPEG cache, as in RawOptions
    # True: baseline JPEGs go to our own call of nvJPEG's hardware backend (hw_decode.py: the NVJPG
    # engines, queued on the loader's stream without a host sync per batch) where the engines open
    # (A100, H100, H200); other GPUs and other JPEGs still go to torchvision's decode_jpeg. Off by
    # default: measured on an H100 it fed resnet18 at 73.8% of synthetic against torchvision's 75.4%,
    # resnet50 at 84.4% against 90.2% (benchmarks/results/gpu-session-H100-2026-12-05.md)
    hardware: bool = False
    # GPU threads decoding batches side by side, each with its own CUDA stream and (with hardware) its own
    # nvJPEG handle: the hardware call spends its time in nvJPEG's host-side setup per image, which
    # lanes overlap. torchvision's decode_jpeg serialises every call of a process, so lanes without
    # hardware overlap only the crops
    lanes: int = 1
    # True: a reader copies each batch's JPEG bytes into a pinned slot of a ring, so nvJPEG's copy of
    # each image to the GPU is a DMA; False: nvJPEG reads them where they lie (the cache's page cache),
    # one host-synchronous pageable copy per image (benchmarks/hw_output.py counted it). Opt-in: feeding
    # resnet18 on an H100 it gained nothing (79.7% of synthetic against 81.6%; README, Compact caches)
    pinned: bool = False
    # share of each batch decoded on the CPU instead (read/backends/cpu_share.py; decode_pool.py): for a
    # GPU whose decoder, run beside a fast model, slows it while the CPUs idle. Batches whose sizes the
    # header walk cannot give, or with turned (EXIF) images, stay whole on the GPU; 1.0 decodes every
    # image on the CPU and crops on the GPU. None: decode_pool.resolve_share picks it for a JPEG cache from
    # the decode processes and the cache's image size (1.0 from 12 processes at 256 px; 0 on a host with
    # under 6 CPUs, and for JPEG files, whose sizes vary and were not measured). On an H100 host the default
    # (share 1.0 in 12 processes) fed resnet18 at 99.0% of synthetic and resnet50 at 99.6%, against 77.8%
    # and 93.3% for the GPU decoder alone (README, Compact caches)
    cpu_share: float | None = None
    # processes decoding that share (decode_pool.py: forked when the loader is made, writing into shared
    # slots), so that decoding takes no GIL from the training's process. None: the usable CPUs of this
    # rank (its share of the host's under torchrun) less 4 for the training's own threads; 0: the reader
    # threads decode the share (share 0.5 beside resnet18 on an H100: 60-63% of synthetic, against 90.6%
    # in 12 processes; host-probe-resnet18-jpeg-H100-80GB-HBM3-2026-12-07-default-vs-engines.md)
    cpu_processes: int | None = None

    def check(self) -> None:
        check_mode(self.integrity)
        procs = self.cpu_processes
        if procs is not None and (not isinstance(procs, int) or isinstance(procs, bool) or procs < 0):
            raise LoaderError(f"NvjpegOptions(cpu_processes={procs!r}): give a whole number of decode processes, 0 "
                              f"to decode the CPU share in the reader threads, or None to size it to the CPUs")
        if procs and self.cpu_share == 0:
            raise LoaderError(f"NvjpegOptions(cpu_processes={procs}) with cpu_share=0: the processes would decode "
                              f"nothing; give cpu_share (e.g. 0.5), or leave it None to pick one")
        share = self.cpu_share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0.0 <= share <= 1.0):
            raise LoaderError(f"NvjpegOptions(cpu_share={self.cpu_share!r}): give the share of each batch to "
                              f"decode on the CPU, from 0.0 to 1.0")
        if not isinstance(self.lanes, int) or isinstance(self.lanes, bool) or self.lanes < 1:
            raise LoaderError(f"NvjpegOptions(lanes={self.lanes!r}): give a whole number of GPU threads, 1 or more")


@dataclass(frozen=True, kw_only=True)
class DaliOptions:
    """Backend dali: NVIDIA DALI decodes with nvJPEG ("mixed") on the GPU, or on its CPU pipeline."""

    integrity: str = "shard"
    # share of images sent to the A100/H100 hardware JPEG decoder (ignored where there is none). 1.0, not
    # DALI's 0.65: the faster both alone and end to end on the H200 (benchmarks/dali_limits.py)
    hw_decoder_load: float = 1.0
    # images with fewer pixels get their Huffman decoding on DALI's CPU threads (nvJPEG hybrid), the rest
    # on the GPU; DALI's default 1M sends every ImageNet-sized JPEG to the CPU (benchmarks/decode.py)
    hybrid_huffman_threshold: int = 1_000_000
    # image folders: "native" reads files with DALI's C++ fn.readers.file; "feed" reads them in Python
    # threads through fn.external_source, as JPEG caches always are
    file_reader: str = "native"
    # DALI pipelines taking batches in turn, each with threads / pipelines CPU threads
    pipelines: int = 1
    # train crops: "plan" draws each crop and flip from (seed, epoch, batch), resumable like every other
    # backend; "dali" uses DALI's own random crop operator (draws restart with a rebuilt pipeline)
    crop: str = "plan"

    def check(self) -> None:
        check_mode(self.integrity)
        if self.pipelines < 1:
            raise LoaderError(f"pipelines={self.pipelines}: must be at least 1")
        if self.file_reader not in ("native", "feed"):
            raise LoaderError(f"file_reader={self.file_reader!r}: choose native or feed")
        if self.crop not in ("plan", "dali"):
            raise LoaderError(f"crop={self.crop!r}: choose plan (resumable) or dali")


OPTIONS = {"raw": RawOptions, "pil": DecodeOptions, "nvjpeg": NvjpegOptions, "dali": DaliOptions}


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    batch_size: int
    backend: str = "raw"
    device: str = "auto"                # auto: cuda when available, else cpu
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    # None: uint8 NHWC batches (backend raw only); else crop, flip and normalise on the way
    augment: AugmentConfig | None = None
    threads: int | None = None          # None: the backend's default (BACKEND_DEFAULTS)
    prefetch: int | None = None
    rank: int | None = None             # None: from torch.distributed / torchrun's RANK when set
    world_size: int | None = None
    # an image folder's class folders without images: an error naming one (torchvision's ImageFolder
    # raises too), or labels without samples (its allow_empty=True); caches decided this at build time
    allow_empty_classes: bool = False
    # batches handed out whose GPU work may still be queued: before handing out the next one the loader
    # waits, GIL released, until the GPU is that close (fence.py says why). 0: no bound (torch's own).
    # No effect off CUDA; the Engine lifts it while it fences its own steps
    max_inflight_batches: int = 3
    options: RawOptions | DecodeOptions | NvjpegOptions | DaliOptions = field(default_factory=RawOptions)

    @property
    def reader_threads(self) -> int:
        return self.threads if self.threads is not None else BACKEND_DEFAULTS[self.backend][0]

    @property
    def read_ahead(self) -> int:
        """Batches read ahead. With a CPU share of decoding (NvjpegOptions.cpu_share) every reader thread
        should have a batch: one thread reads (and decodes) a whole batch, so at the default of 4 only 4 of
        threads=14 decoded, capping cpu_share=1.0 near 4 x 256 images per 77 ms (0.3 ms an image)."""
        if self.prefetch is not None:
            return self.prefetch
        ahead = BACKEND_DEFAULTS[self.backend][1]
        if getattr(self.options, "cpu_share", None):      # (None: the backend widens it if it picks a share)
            ahead = max(ahead, self.reader_threads)
        return ahead

    def check(self) -> "LoaderConfig":
        if self.backend not in BACKENDS:
            raise LoaderError(f"backend {self.backend!r}: choose one of {', '.join(BACKENDS)} or auto")
        if not isinstance(self.batch_size, numbers.Integral) or isinstance(self.batch_size, bool):
            raise LoaderError(f"batch_size={self.batch_size!r}: give a whole number of samples, e.g. "
                              f"batch_size=int(...)")
        if not isinstance(self.seed, numbers.Integral) or isinstance(self.seed, bool):
            raise LoaderError(f"seed={self.seed!r}: give an integer")
        if self.batch_size < 1:
            raise LoaderError(f"batch_size={self.batch_size}: must be at least 1")
        check_inflight(self.max_inflight_batches)
        if self.reader_threads < 1 or self.read_ahead < 1:
            raise LoaderError(f"threads={self.reader_threads}, prefetch={self.read_ahead}: both must be at least 1")
        if not isinstance(self.options, OPTIONS[self.backend]):
            raise LoaderError(f"backend {self.backend} takes {OPTIONS[self.backend].__name__}, "
                              f"not {type(self.options).__name__}")
        self.options.check()
        return self


def split_options(backend: str, options: dict):
    """The backend's options object from loose keyword arguments; an option it does not take is a
    LoaderError that names the backends that do."""
    cls = OPTIONS[backend]
    names = {f.name for f in dataclasses.fields(cls)}
    for key in options:
        if key not in names:
            takers = [b for b, c in OPTIONS.items() if key in {f.name for f in dataclasses.fields(c)}]
            where = f"only backend {', '.join(takers)} takes it" if takers else "no backend takes it"
            raise LoaderError(f"option {key}= does not apply to backend {backend}: {where}"
                              + (f" (options of {backend}: {', '.join(sorted(names))})" if names else ""))
    return cls(**options)


def check_inflight(value) -> int:
    """max_inflight_batches as given: a whole number of batches, 0 for no bound."""
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0:
        raise LoaderError(f"max_inflight_batches={value!r}: give a whole number of batches, or 0 for no bound")
    return int(value)
