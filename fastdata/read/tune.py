"""fastdata.dataloader(): a torch DataLoader with defaults that fit the machine, and autotune.

Defaults: workers = usable CPUs (affinity/cgroup aware) minus one for the
training process, pin_memory when CUDA is present, persistent workers and a
prefetch factor of 4. autotune=True times a few (workers, prefetch) settings
for a bounded time each on the real dataset (never more workers than usable
CPUs) and keeps the fastest, or the default when nothing beats it by 5%; the
choice, all measurements and the gain are in ``loader.tuning``.
"""
from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import asdict, dataclass, replace

import torch
from torch.utils.data import DataLoader, IterableDataset

from .._util import batch_len, usable_cpus
from ..errors import LoaderError

log = logging.getLogger("fastdata.tune")


@dataclass(frozen=True)
class DataLoaderConfig:
    batch_size: int
    shuffle: bool | None = None       # None: True for a map-style Dataset; an IterableDataset orders itself
    workers: int | None = None        # None: usable CPUs - 1 (0 for an IterableDataset: see _iterable)
    pin_memory: bool | None = None    # None: when CUDA is available
    prefetch_factor: int = 4
    persistent_workers: bool = True
    drop_last: bool = False
    seed: int = 0

    def resolved(self) -> "DataLoaderConfig":
        workers = max(0, usable_cpus() - 1) if self.workers is None else self.workers
        pin = torch.cuda.is_available() if self.pin_memory is None else self.pin_memory
        return replace(self, workers=workers, pin_memory=pin)


def _iterable(dataset, cfg: DataLoaderConfig, autotune_seconds) -> DataLoaderConfig:
    """torch's rules for an IterableDataset: no shuffle option (it orders its own samples), and every
    worker process runs the whole iterator unless the dataset splits it with get_worker_info(), which
    cannot be seen from outside: the default of CPUs - 1 workers yielded each sample that many times."""
    if cfg.shuffle:
        raise LoaderError(f"{type(dataset).__name__} is an IterableDataset, which orders its own samples: "
                          f"leave shuffle unset (shuffle inside the dataset), or use a map-style Dataset")
    if autotune_seconds and cfg.workers is None:
        raise LoaderError(f"{type(dataset).__name__} is an IterableDataset: autotune cannot tell whether it "
                          f"splits its samples across workers (get_worker_info), and more workers would only "
                          f"repeat them; pass workers=N once it does, or leave autotune_seconds out")
    if cfg.workers is None:
        log.info("%s is an IterableDataset: 0 workers (each worker would yield every sample unless the "
                 "dataset splits them with torch.utils.data.get_worker_info(); pass workers=N once it does)",
                 type(dataset).__name__)
    return replace(cfg, shuffle=False, workers=0 if cfg.workers is None else cfg.workers)


def _build(dataset, cfg: DataLoaderConfig, collate_fn=None) -> DataLoader:
    w = cfg.workers
    gen = torch.Generator()
    gen.manual_seed(cfg.seed)
    shuffle = None if isinstance(dataset, IterableDataset) else cfg.shuffle is not False
    return DataLoader(dataset, cfg.batch_size, shuffle=shuffle, num_workers=w, pin_memory=cfg.pin_memory,
                      drop_last=cfg.drop_last, generator=gen, collate_fn=collate_fn,
                      prefetch_factor=cfg.prefetch_factor if w else None,
                      persistent_workers=cfg.persistent_workers and w > 0)


def measure(dl, seconds: float, warmup_batches: int = 2) -> float:
    """Samples per second drawn from dl for about `seconds`, after warm-up batches."""
    it = iter(dl)
    n, t0 = 0, None
    for k, batch in enumerate(it):
        if k == warmup_batches:
            t0 = time.perf_counter()
        elif k > warmup_batches:
            n += batch_len(batch)
            if time.perf_counter() - t0 >= seconds:
                break
    if t0 is None or n == 0:
        return 0.0
    return n / (time.perf_counter() - t0)


MIN_GAIN = 0.05   # a candidate must beat the default by this much to replace it (timing noise is ~ this)


def _candidates(base: DataLoaderConfig) -> list[DataLoaderConfig]:
    """The default first, then few far-apart settings within the usable CPUs (more worker processes
    than CPUs only contend, and torch warns about them): each costs a start-up plus the timed window."""
    cpus = usable_cpus()
    workers = sorted({max(1, cpus // 2), cpus})
    cands = [base] + [replace(base, workers=w, prefetch_factor=p) for w, p in itertools.product(workers, (2, 8))]
    return list({(c.workers, c.prefetch_factor): c for c in cands}.values())


def autotune(dataset, base: DataLoaderConfig, seconds: float = 2.0, collate_fn=None):
    """Try the default and each candidate for `seconds`; return (chosen config, [(config dict, img/s)],
    gain over the default). The default is kept unless a candidate is MIN_GAIN faster."""
    results = []
    for cand in _candidates(base.resolved()):
        dl = _build(dataset, replace(cand, persistent_workers=False), collate_fn)
        rate = measure(dl, seconds)
        results.append((asdict(cand), rate))
        log.info("autotune: workers=%d prefetch=%d -> %.0f img/s", cand.workers, cand.prefetch_factor, rate)
        del dl
    default_rate = results[0][1]
    best = max(results, key=lambda r: r[1])
    gain = best[1] / default_rate - 1 if default_rate > 0 else 0.0
    if gain < MIN_GAIN:
        log.info("autotune: no setting beat the default (workers=%d prefetch=%d, %.0f img/s) by %d%%; keeping it",
                 results[0][0]["workers"], results[0][0]["prefetch_factor"], default_rate, MIN_GAIN * 100)
        best, gain = results[0], 0.0
    return DataLoaderConfig(**best[0]), results, gain


def tuned_dataloader(dataset, batch_size: int, *, autotune_seconds: float | None = None, collate_fn=None,
                     **options) -> DataLoader:
    """A torch DataLoader (worker processes, not fastdata's loader) tuned for this machine. autotune_seconds=T measures settings for ~T s each.

    options: see DataLoaderConfig (shuffle, workers, pin_memory, prefetch_factor, ...).
    """
    cfg = DataLoaderConfig(batch_size, **options)
    if cfg.batch_size < 1 or (cfg.workers is not None and cfg.workers < 0) or cfg.prefetch_factor < 1:
        raise LoaderError(f"tuned_dataloader({cfg}): batch_size and prefetch_factor must be >= 1, workers >= 0")
    if isinstance(dataset, IterableDataset):
        cfg = _iterable(dataset, cfg, autotune_seconds)
    elif hasattr(dataset, "__len__") and len(dataset) == 0:   # torch: "num_samples should be a positive integer"
        raise LoaderError(f"tuned_dataloader: {type(dataset).__name__} has no samples (len 0); check the data "
                          f"set's path or filter")
    tuning = None
    if autotune_seconds:
        cfg, results, gain = autotune(dataset, cfg, autotune_seconds, collate_fn)
        tuning = {"chosen": asdict(cfg), "measured": results, "gain": gain}
        log.info("autotune chose workers=%d prefetch=%d", cfg.workers, cfg.prefetch_factor)
    cfg = cfg.resolved()
    if cfg.workers:
        warn_small_shm()
    dl = _build(dataset, cfg, collate_fn)
    dl.tuning = tuning
    return dl


SMALL_SHM = 512 << 20


def warn_small_shm(path: str = "/dev/shm") -> bool:
    """Warn where /dev/shm is small (Docker gives 64 MB): DataLoader workers hand every batch over
    through it, and a full /dev/shm kills them with a bare 'Bus error' mid-epoch."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    size = st.f_blocks * st.f_frsize
    if size >= SMALL_SHM:
        return False
    log.warning("%s holds only %d MB (Docker's default is 64 MB): DataLoader worker processes pass batches "
                "through it and die with 'Bus error' when it fills. Start the container with --shm-size=8g "
                "(or --ipc=host), or use fastdata.loader, whose reader threads need no shared memory",
                path, size >> 20)
    return True


dataloader = tuned_dataloader   # the wave-1 name, kept one release: one prefix away from fastdata.loader
