"""Backend dali: NVIDIA DALI decodes JPEGs with nvJPEG ("mixed") on the GPU, or on CPU without one.

The samples come in the read side's SampleOrder (dali_plan.py), so the shuffle,
rank split, resume state and coverage audit are the same as fastdata.loader's.
An image folder is read by DALI's own C++ ``fn.readers.file``, given this
order as its unshuffled ``files`` list; a JPEG cache is fed through
``fn.external_source``. (The reader's own shuffling was set aside: its
shuffle buffer makes the visited order unknowable, which would lose exact
resume.) Decode, random-resized crop, resize, flip and normalisation run
inside the DALI graph on the pipeline's device.

The pipeline runs DALI's asynchronous executor: while the training step
runs, DALI already decodes the next ``prefetch`` batches in its own threads
and CUDA stream, through epoch boundaries. Every output carries its sample
indices, checked against the plan. A pass left early (a time limit, a break,
a load_state_dict) leaves batches inside DALI that the order does not expect
next; the loader then builds a fresh pipeline from the order's state rather
than hand them out. With ``pipelines`` > 1, that many pipelines take the
plan's batches in turn (lanes), so one's decoder works while another waits.
"""
from __future__ import annotations

from collections import deque
from itertools import islice
from typing import NamedTuple

import numpy as np
import torch

from ...errors import DependencyError, LoaderError
from ..augment import AugmentConfig
from ..config import DaliOptions
from . import BaseBackend
from .dali_crop import HeaderSizes, WindowFeed
from .dali_plan import Feeder, Planned, files_for, native_plan, plan
from ..encoded import EncodedSource, undecodable


class _Lane(NamedTuple):
    pipe: object
    fed: deque          # planned batches handed to this pipeline, oldest first


def _dali():
    try:
        from nvidia import dali
        from nvidia.dali import fn, types

        return dali, fn, types
    except ImportError:
        raise DependencyError("the DALI backend needs NVIDIA DALI: pip install 'fastdata[dali]' "
                              "(or use backend nvjpeg / cpu)") from None


def _graph(encoded, idx, aug: AugmentConfig, opts: DaliOptions, gpu: bool, window=None):
    """encoded JPEG bytes + sample indices -> (images NHWC float, indices on CPU, indices on device).
    window: each sample's (anchor, shape, mirror) from the plan (dali_crop.py), crops that survive a
    resume; only that window is decoded."""
    dali, fn, types = _dali()
    dev = "mixed" if gpu else "cpu"
    extra = {"hw_decoder_load": opts.hw_decoder_load,
             "hybrid_huffman_threshold": opts.hybrid_huffman_threshold} if gpu else {}
    if aug.train and window is not None:
        anchor, shape, mirror = window
        images = fn.decoders.image_slice(encoded, anchor, shape, device=dev, output_type=types.RGB,
                                         normalized_anchor=False, normalized_shape=False, **extra)
        images = fn.resize(images, size=[aug.size, aug.size], antialias=True)
    elif aug.train:
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
    idx = fn.cast(idx, dtype=types.INT64)
    return (images, idx, idx.gpu()) if gpu else (images, idx)


def _to_torch(tl, device: torch.device) -> torch.Tensor:
    from nvidia.dali import types
    from nvidia.dali.plugin.pytorch import feed_ndarray

    t = tl.as_tensor()
    dtypes = {types.FLOAT: torch.float32, types.FLOAT16: torch.float16, types.INT64: torch.int64,
              types.INT32: torch.int32, types.UINT8: torch.uint8}
    out = torch.empty(t.shape(), dtype=dtypes[t.dtype], device=device)
    stream = torch.cuda.current_stream(device) if device.type == "cuda" else None
    feed_ndarray(t, out, cuda_stream=stream)
    return out


def _dali_reason(e: Exception) -> str:
    """The line of DALI's error that says what went wrong (it opens with the graph's traceback)."""
    text = str(e).split("encountered:")[-1].strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def utf8_paths(source) -> bool:
    """Whether DALI's file reader can take every path: it takes UTF-8 strings only, and a file named in
    another encoding (a Latin-1 name from an old archive) failed the pipeline's build ("Unsupported
    argument type with name files"). Where one cannot be, the files are read in Python (the feed)."""
    try:        # one join and one encode: 0.3 s for ImageNet's 1.28M paths on the 2-core box
        "\n".join([str(item.path) for item in source.items]).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class DaliBackend(BaseBackend):
    kind = "dali"
    streamed = True

    def __init__(self, source: EncodedSource, cfg, device: torch.device) -> None:
        _dali()
        opts = cfg.options
        self.encoded, self.cfg, self.opts, self.device = source, cfg, opts, device
        self.gpu = device.type == "cuda"
        self.shard_counts, self.window, self.where = source.shard_counts, source.window, str(source.path)
        self.native = source.kind == "files" and opts.file_reader == "native" and utf8_paths(source)
        self.name = f"dali-{'mixed' if self.gpu else 'cpu'}-{source.kind}"
        self._labels = torch.as_tensor(source.labels(), dtype=torch.int64).to(device)
        self._threads = max(1, cfg.reader_threads // opts.pipelines)   # each pipeline's DALI (and feeding) threads
        self._feeders = [] if self.native else [Feeder(source, self._threads, cfg.read_ahead + 2)
                                                for _ in range(opts.pipelines)]
        self.order = None
        self.lanes: list[_Lane] = []
        self._turn = 0                                   # the lane whose output comes next
        self._next: tuple[int, int] | None = None       # (epoch, position) of the next output
        self._plan_end: tuple[int, int] | None = None   # where the native reader's files list ends
        self._sizes = None                               # image sizes from headers (native reader crops)
        self._window_feeds: list[WindowFeed] = []

    def attach(self, order) -> None:
        self.order = order

    def _start(self) -> None:
        """Fresh pipelines whose first outputs are the batches the order expects next."""
        here = (self.order.epoch, self.order.position)
        self.lanes = []                          # the old pipelines' buffers go before new ones are made
        self._close_window_feeds()
        n = self.opts.pipelines
        if self.native:
            planned = native_plan(self.order, *here)
            self._plan_end = planned[-1].after
            self.lanes = [self._lane(j, planned[j::n], None) for j in range(min(n, len(planned)))]
        else:
            self._plan_end = None
            self.lanes = [self._lane(j, None, islice(plan(self.order, *here), j, None, n)) for j in range(n)]
        self._turn, self._next = 0, here

    def _lane(self, j: int, planned: list[Planned] | None, feed) -> _Lane:
        """One pipeline: DALI's file reader over `planned`, or a Feeder drawing from `feed`."""
        dali, fn, types = _dali()
        cfg, fed = self.cfg, deque()
        pipe = dali.pipeline.Pipeline(batch_size=cfg.batch_size, num_threads=self._threads,
                                      seed=cfg.seed + 1 + j, device_id=self.device.index if self.gpu else None,
                                      prefetch_queue_depth=cfg.read_ahead)
        planned_crops = self.opts.crop == "plan" and cfg.augment.train
        with pipe:
            window = None
            if planned is not None:
                files, idx = files_for(self.encoded, planned, cfg.batch_size)
                encoded, index = fn.readers.file(files=files, labels=idx, random_shuffle=False,
                                                 prefetch_queue_depth=2, name="files")
                fed.extend(planned)
                if planned_crops:   # the bytes stay in DALI: windows from the images' header sizes
                    if self._sizes is None:
                        self._sizes = HeaderSizes(self.encoded)
                    windows = WindowFeed(planned, self._sizes, cfg.augment, cfg.seed, cfg.batch_size,
                                         self._threads, cfg.read_ahead + 2)
                    self._window_feeds.append(windows)
                    window = fn.external_source(source=windows, num_outputs=3, batch=True,
                                                dtype=[types.FLOAT, types.FLOAT, types.INT32])
            else:
                self._feeders[j].start(feed, fed, (cfg.augment, cfg.seed, cfg.batch_size) if planned_crops else None)
                encoded, index, *window = fn.external_source(
                    source=self._feeders[j], num_outputs=5 if planned_crops else 2, batch=True,
                    dtype=[types.UINT8, types.INT64] + ([types.FLOAT, types.FLOAT, types.INT32] if planned_crops
                                                        else []))
            pipe.set_outputs(*_graph(encoded, index, cfg.augment, self.opts, self.gpu, window or None))
        pipe.build()
        return _Lane(pipe, fed)

    def next_batch(self, epoch: int, position: int):
        """(indices, images, labels) of the batch at (epoch, position), which DALI has decoded ahead."""
        aug = self.cfg.augment
        here = (epoch, position)
        if not self.lanes or self._next != here or here == self._plan_end:
            self._start()
        lane = self.lanes[self._turn]
        self._turn = (self._turn + 1) % len(self.lanes)
        images, idx_host, idx_dev = self._run(lane)
        p = self._check(lane.fed, idx_host)
        n = len(p.idx)
        # NHWC float from DALI; the NCHW view of it is channels_last memory, no copy
        fmt = torch.channels_last if aug.channels_last else torch.contiguous_format
        x = _to_torch(images, self.device)[:n].permute(0, 3, 1, 2)
        x = x.to(dtype=getattr(torch, aug.dtype), memory_format=fmt)
        y = self._labels[_to_torch(idx_dev, self.device).view(-1)[:n]]
        self._next = p.after
        return p.idx, x, y

    def _close_window_feeds(self) -> None:
        for feed in self._window_feeds:
            feed.close()
        self._window_feeds = []

    def close(self) -> None:
        self.lanes = []
        self._close_window_feeds()
        for f in self._feeders:
            f.pool.shutdown(wait=False, cancel_futures=True)

    def _check(self, fed: deque, idx_host) -> Planned:
        """The planned batch this output is; its sample indices must be the ones DALI decoded."""
        p = fed.popleft()
        got = idx_host.as_array().reshape(-1)[:len(p.idx)]
        if not np.array_equal(got, p.idx):
            raise LoaderError(f"{self.encoded.path}: DALI returned samples {got[:4].tolist()}... where the order "
                              f"has {p.idx[:4].tolist()}... (epoch {p.epoch}, position {p.position}); this is a "
                              f"fastdata bug, please report it")
        return p

    def _run(self, lane: _Lane):
        """pipe.run() in this (training) thread. Tried and rejected (benchmarks/pipeline.py rows 6b and 7,
        results/pipeline-H200-*): running DALI in a producer thread so that feeding and output copies
        leave the training thread. Data wait fell but so did the duty cycle, and both rows lost 13-18%:
        the producer's Python competes with the training thread for the GIL."""
        try:
            # outputs bound to our stream: no host wait for DALI's GPU work (which queues behind the
            # training step's kernels); the training stream waits for it instead
            stream = torch.cuda.current_stream(self.device) if self.gpu else None
            images, idx_host, *idx_dev = lane.pipe.run(stream) if stream is not None else lane.pipe.run()
            return images, idx_host, idx_dev[0] if idx_dev else idx_host
        except Exception as e:  # noqa: BLE001 - DALI raises RuntimeError for a bad image, say which
            self.lanes = []       # DALI says the pipeline is no longer valid; the next pass starts afresh
            batch_no = self.order.position // self.cfg.batch_size
            ahead = list(islice(lane.fed, self.cfg.read_ahead + 2))    # the batches DALI was working on
            bad = undecodable(self.encoded, np.concatenate([p.idx for p in ahead]) if ahead else [])
            where = f"(batch {batch_no} of epoch {self.order.epoch})"
            fix = (f"cannot decode {', '.join(bad)} {where}; remove or replace it, or build a cache with "
                   f"`fastdata build-cache`, which quarantines bad images" if bad else
                   f"DALI failed {where}, though PIL decodes each image of it (a format DALI does not read); "
                   f"use backend='pil', or build a cache with `fastdata build-cache`, which decodes with PIL")
            raise LoaderError(f"{self.encoded.path}: {fix}. DALI said: {_dali_reason(e)}") from e
