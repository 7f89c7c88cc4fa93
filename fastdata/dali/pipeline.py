"""DaliLoader: NVIDIA DALI decodes JPEGs with nvJPEG ("mixed") on the GPU, or on CPU without one.

Encoded samples are fed through ``fn.external_source`` from the read side's
SampleOrder (files of an image folder, or samples of a JPEG cache), so the
shuffle, rank split, resume state and coverage audit are the same as
fastdata.loader's. (``fn.readers.file`` was set aside: its internal shuffle
buffer makes the visited order unknowable, which would lose exact resume.)
Decode, random-resized crop, resize, flip and normalisation run inside the
DALI graph on the pipeline's device.

The pipeline runs DALI's asynchronous, pipelined executor: while the training
step runs, DALI already decodes the next ``prefetch`` batches in its own
threads and CUDA stream. Reading the encoded bytes happens in a small thread
pool ahead of DALI asking for them, so the feeding call in the training thread
only hands over finished lists. An epoch left early (a time limit, a break)
leaves prefetched batches inside DALI; the next epoch then builds a fresh
pipeline rather than hand out stale batches.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ..data.augment import AugmentConfig
from ..data.batch import Batch, Coverage, Resumable
from ..data.order import OrderConfig, SampleOrder
from ..errors import DependencyError, LoaderError
from .source import EncodedSource


@dataclass(frozen=True)
class DaliConfig:
    batch_size: int
    augment: AugmentConfig = AugmentConfig()
    device: str = "auto"          # auto: mixed (GPU) when CUDA is present, else cpu
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    threads: int = 4               # DALI's CPU threads (and as many file-reading threads)
    prefetch: int = 2              # batches DALI decodes ahead of the training step
    hw_decoder_load: float = 0.65  # share of images sent to the A100/H100 hardware JPEG decoder
    # images with fewer pixels get their Huffman decoding on DALI's CPU threads (nvJPEG hybrid), the rest
    # on the GPU; DALI's default 1M sends every ImageNet-sized JPEG to the CPU. 0: all on the GPU, which
    # frees CPU threads but costs SM time that training would use (benchmarks/decode.py measures both).
    hybrid_huffman_threshold: int = 1_000_000
    rank: int = 0
    world_size: int = 1


def _dali():
    try:
        from nvidia import dali
        from nvidia.dali import fn, types

        return dali, fn, types
    except ImportError:
        raise DependencyError("the DALI backend needs NVIDIA DALI: pip install 'fastdata[dali]' "
                              "(or use backend nvjpeg / cpu)") from None


class _Feeder:
    """external_source callable: one batch of (encoded bytes, labels) per call; StopIteration at epoch end.

    The bytes of the next batches are read ahead in threads (np.fromfile releases the GIL), so DALI's
    call into this, which runs in the training thread, only collects a finished list.
    """

    def __init__(self, source: EncodedSource, threads: int, ahead: int) -> None:
        self.source, self.ahead = source, ahead
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="fastdata-dali-read")
        self.batches, self.k, self.pending = [], 0, deque()

    def _read(self, idx):
        encoded, labels = zip(*(self.source.get(i) for i in idx))
        return list(encoded), [np.array([lab], dtype=np.int64) for lab in labels]

    def start(self, batches) -> None:
        for fut in self.pending:
            fut.cancel()
        self.batches, self.k, self.pending = batches, 0, deque()
        for idx in batches[:self.ahead]:
            self.pending.append(self.pool.submit(self._read, idx))

    def __call__(self):
        if self.k >= len(self.batches):
            raise StopIteration
        nxt = self.k + len(self.pending)
        if nxt < len(self.batches):
            self.pending.append(self.pool.submit(self._read, self.batches[nxt]))
        self.k += 1
        return self.pending.popleft().result()


def _graph(feeder, cfg: DaliConfig, gpu: bool):
    dali, fn, types = _dali()
    aug = cfg.augment
    encoded, labels = fn.external_source(source=feeder, num_outputs=2, batch=True, dtype=[types.UINT8, types.INT64])
    dev = "mixed" if gpu else "cpu"
    extra = {"hw_decoder_load": cfg.hw_decoder_load,
             "hybrid_huffman_threshold": cfg.hybrid_huffman_threshold} if gpu else {}
    if aug.train:
        images = fn.decoders.image_random_crop(encoded, device=dev, output_type=types.RGB,
                                               random_area=list(aug.scale), random_aspect_ratio=list(aug.ratio),
                                               num_attempts=10, **extra)
        images = fn.resize(images, size=[aug.size, aug.size], antialias=True)
        mirror = fn.random.coin_flip(probability=0.5) if aug.flip else 0
    else:
        images = fn.decoders.image(encoded, device=dev, output_type=types.RGB, **extra)
        images = fn.resize(images, resize_shorter=round(aug.size / aug.crop_fraction), antialias=True)
        mirror = 0
    images = fn.crop_mirror_normalize(images, crop=[aug.size, aug.size], mirror=mirror, dtype=types.FLOAT,
                                      output_layout="HWC", mean=[m * 255 for m in aug.mean],
                                      std=[s * 255 for s in aug.std])
    return images, labels.gpu() if gpu else labels


def _to_torch(tl, device: torch.device) -> torch.Tensor:
    from nvidia.dali.plugin.pytorch import feed_ndarray

    t = tl.as_tensor()
    out = torch.empty(t.shape(), dtype=torch.float32 if "float" in str(t.dtype).lower() else torch.int64,
                      device=device)
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    feed_ndarray(t, out, cuda_stream=stream)
    return out


class DaliLoader(Resumable):
    def __init__(self, source: EncodedSource, cfg: DaliConfig) -> None:
        _dali()
        gpu = torch.cuda.is_available() if cfg.device == "auto" else cfg.device.startswith("cuda")
        if gpu and not torch.cuda.is_available():
            raise LoaderError(f"device={cfg.device!r} but CUDA is not available; use device='cpu'")
        if cfg.prefetch < 1 or cfg.threads < 1:
            raise LoaderError(f"threads={cfg.threads}, prefetch={cfg.prefetch}: both must be at least 1")
        self.encoded, self.cfg, self.gpu = source, cfg, gpu
        self.device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
        ocfg = OrderConfig(cfg.shuffle, cfg.seed, source.window, cfg.rank, cfg.world_size)
        self.order = SampleOrder(source.shard_counts, cfg.batch_size, ocfg, cfg.drop_last)
        self.coverage_audit = Coverage(len(source))
        self.source = f"dali-{'mixed' if gpu else 'cpu'}-{source.kind}"
        self._feeder = _Feeder(source, cfg.threads, cfg.prefetch + 2)
        self.pipe, self._clean = self._build(), True

    def _build(self):
        dali, fn, types = _dali()
        cfg = self.cfg
        pipe = dali.pipeline.Pipeline(batch_size=cfg.batch_size, num_threads=cfg.threads, seed=cfg.seed + 1,
                                      device_id=self.device.index if self.gpu else None,
                                      prefetch_queue_depth=cfg.prefetch)
        with pipe:
            pipe.set_outputs(*_graph(self._feeder, cfg, self.gpu))
        return pipe

    def __iter__(self):
        batches = self._epoch_batches()
        self._feeder.start(batches)
        if not self._clean:            # the last epoch was left early: DALI holds its prefetched batches
            self.pipe = self._build()
        self.pipe.build()
        self._clean = False
        aug = self.cfg.augment
        for idx in batches:
            images, labels = self._run()
            # NHWC float from DALI; the NCHW view of it is channels_last memory, no copy
            x = _to_torch(images, self.device).permute(0, 3, 1, 2)
            fmt = torch.channels_last if aug.channels_last else torch.contiguous_format
            x = x.to(dtype=getattr(torch, aug.dtype), memory_format=fmt)
            y = _to_torch(labels, self.device).view(-1)
            self._yielded(idx)
            yield Batch(x, y, torch.from_numpy(idx), self.source)
        self.pipe.reset()             # the feeder raised StopIteration inside DALI's prefetch
        self._clean = True
        self.order.next_epoch()

    def _run(self):
        """pipe.run() in this (training) thread. Tried and rejected (H200, 2026-12-03): running DALI in
        a producer thread so that feeding and output copies leave the training thread. Data wait fell
        (23% -> 13%) but so did the duty cycle: row 7 went from 6,054 to 4,942 img/s and 6b from 6,273 to
        5,470; the producer's Python competes with the training thread for the GIL."""
        try:
            return self.pipe.run()
        except StopIteration:
            raise
        except Exception as e:  # noqa: BLE001 - DALI raises RuntimeError for a bad image, say where
            batch_no = self.order.position // self.cfg.batch_size
            raise LoaderError(f"{self.encoded.path}: DALI failed on batch {batch_no} of epoch {self.order.epoch}: "
                              f"{e}") from e
