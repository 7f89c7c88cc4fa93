"""DecodeLoader: JPEG decode on the GPU with nvJPEG (torchvision.io.decode_jpeg), or with PIL on CPU.

The fallback for machines with a GPU but without DALI. Two stages run ahead
of the training loop::

    reader threads:  encoded bytes (files or cache samples); PIL decodes here too (GIL released)
    one GPU thread:  on its own CUDA stream: nvJPEG decodes the batch in one call, then one packed
                     crop-resize (resize.py), flip and normalise; records an event
    training thread: waits for that event on its stream (no host sync) and yields

so the training thread launches none of the decode work. Same Batch
contract, order, resume and coverage as fastdata.loader.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from ..augment import AugmentConfig, normalize
from ..batch import Batch, Coverage, Resumable
from ..order import OrderConfig, SampleOrder
from ...cache.codecs import open_rgb
from ...errors import DependencyError, LoaderError, SampleError
from ..crop_box import crop_box
from .gpu_resize import crop_resize, pack
from ..encoded import EncodedSource


@dataclass(frozen=True)
class DecodeConfig:
    batch_size: int
    augment: AugmentConfig = AugmentConfig()
    device: str = "cuda"
    decoder: str = "nvjpeg"          # nvjpeg (GPU) | pil (CPU threads)
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False
    threads: int = 8                 # reader threads
    prefetch: int = 4                # batches read ahead; the GPU stage runs up to 2 of them ahead
    rank: int = 0
    world_size: int = 1


def _pil_decode(data: np.ndarray, rng: np.random.Generator, cfg: AugmentConfig, name: str) -> np.ndarray:
    """The build's decode (EXIF rotation, 16-bit, CMYK, alpha handled alike), then the crop."""
    try:
        img = open_rgb(data.tobytes(), draft=cfg.size)
    except SampleError as e:
        raise LoaderError(f"{name}: {e}; fix or remove the file, or build a cache first (fastdata build-cache "
                          f"quarantines undecodable files)") from None
    t, left, h, w = crop_box(img.height, img.width, cfg, rng)
    return np.asarray(img.resize((cfg.size, cfg.size), Image.BILINEAR, box=(left, t, left + w, t + h)))


class DecodeLoader(Resumable):
    def __init__(self, source: EncodedSource, cfg: DecodeConfig) -> None:
        if cfg.decoder == "nvjpeg":
            try:
                import torchvision.io  # noqa: F401
            except Exception as e:  # noqa: BLE001 - missing or broken beside this torch
                raise DependencyError(f"backend nvjpeg needs torchvision with CUDA ({e}); pip install "
                                      f"'fastdata[dali]' for DALI instead, or use backend cpu") from None
            if not torch.cuda.is_available():
                raise LoaderError("backend nvjpeg needs a CUDA GPU; use backend cpu here")
        self.encoded, self.cfg = source, cfg
        self.device = torch.device(cfg.device)
        ocfg = OrderConfig(cfg.shuffle, cfg.seed, source.window, cfg.rank, cfg.world_size)
        self.order = SampleOrder(source.shard_counts, cfg.batch_size, ocfg, cfg.drop_last)
        self.coverage_audit = Coverage(len(source))
        self.source = f"{cfg.decoder}-{source.kind}"   # names the backend in every Batch
        self._stream = torch.cuda.Stream(self.device) if cfg.decoder == "nvjpeg" else None

    def _rng(self, batch_no: int) -> np.random.Generator:
        return np.random.default_rng([self.cfg.seed, self.order.epoch, batch_no])

    def _read(self, idx: np.ndarray, batch_no: int):
        """Reader thread: encoded bytes (nvjpeg) or decoded, cropped, resized pixels (pil)."""
        rng = self._rng(batch_no)
        encoded, labels = zip(*(self.encoded.get(i) for i in idx))
        flips = rng.random(len(idx)) < 0.5 if self.cfg.augment.train and self.cfg.augment.flip else \
            np.zeros(len(idx), bool)
        if self.cfg.decoder == "pil":
            pixels = np.stack([_pil_decode(e, rng, self.cfg.augment, self.encoded.name(i))
                               for e, i in zip(encoded, idx)])
            return torch.from_numpy(pixels), torch.tensor(labels), torch.from_numpy(flips)
        return list(encoded), torch.tensor(labels), torch.from_numpy(flips), rng  # crops need decoded sizes

    def _gpu_decode(self, encoded, rng, idx, flips) -> torch.Tensor:
        from torchvision.io import ImageReadMode, decode_jpeg

        try:
            decoded = decode_jpeg([torch.from_numpy(e) for e in encoded], mode=ImageReadMode.RGB,
                                  device=self.device)
        except RuntimeError as e:
            raise LoaderError(f"nvJPEG could not decode a sample of batch {idx[:4].tolist()}...: {e}; "
                              f"run `fastdata build-cache` to quarantine bad files first") from e
        boxes = torch.tensor([crop_box(im.shape[1], im.shape[2], self.cfg.augment, rng) for im in decoded])
        packed, sizes = pack(decoded)
        return crop_resize(packed, sizes, boxes, self.cfg.augment.size, flips)

    def _prepare(self, read_future, idx: np.ndarray):
        """GPU stage (its own thread and stream): the finished batch and the event that marks it ready."""
        aug = self.cfg.augment
        if self.cfg.decoder == "pil":
            pixels, labels, flips = read_future.result()
            return normalize(pixels.to(self.device), aug, flips.to(self.device)), labels, None
        encoded, labels, flips, rng = read_future.result()
        with torch.cuda.stream(self._stream):
            images = normalize(self._gpu_decode(encoded, rng, idx, flips), aug, layout="NCHW")
            labels = labels.to(self.device)
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return images, labels, ready

    def _batch(self, item, idx: np.ndarray) -> Batch:
        images, labels, ready = item
        if ready is not None:               # GPU-side wait for the decode stream: no host sync
            main = torch.cuda.current_stream(self.device)
            main.wait_event(ready)
            images.record_stream(main)
            labels.record_stream(main)
        return Batch(images, labels.to(dtype=torch.int64), torch.from_numpy(idx), self.source)

    def __iter__(self):
        batches = self._epoch_batches()
        first = self.order.position // self.cfg.batch_size
        ahead = min(2, self.cfg.prefetch)
        with ThreadPoolExecutor(self.cfg.threads, thread_name_prefix="fastdata-decode") as pool, \
                ThreadPoolExecutor(1, thread_name_prefix="fastdata-gpu-decode") as gpu:
            reads = [pool.submit(self._read, b, first + k) for k, b in enumerate(batches[:self.cfg.prefetch])]
            ready = [gpu.submit(self._prepare, reads[k], batches[k]) for k in range(min(ahead, len(batches)))]
            for k, idx in enumerate(batches):
                nxt = k + self.cfg.prefetch
                if nxt < len(batches):
                    reads.append(pool.submit(self._read, batches[nxt], first + nxt))
                if k + ahead < len(batches):
                    ready.append(gpu.submit(self._prepare, reads[k + ahead], batches[k + ahead]))
                item = ready[k].result()
                reads[k] = ready[k] = None
                batch = self._batch(item, idx)
                self._yielded(idx)
                yield batch
        self.order.next_epoch()
