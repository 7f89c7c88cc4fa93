"""GPU augmentation cost per batch: eager (five passes) vs fused (one compiled kernel).

    python benchmarks/augment.py [--batch-size 256] [--src-size 256] [--reps 50] [--out DIR]

The augmentation runs on the same GPU as the training step, so every
millisecond it takes per batch is taken from the step: on the H200 a compiled
ResNet-50 bf16 step of 256 images takes about 38 ms, so 1 ms of augmentation
is 2.6% of the ceiling. This times RandomResizedCrop(224) + flip + normalise
to bf16 channels_last from a uint8 NHWC batch, with CUDA events (CPU: wall
clock), after warm-up (and compilation).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from _common import write


def time_ms(fn, reps: int, device: torch.device) -> float:
    for _ in range(3):
        fn()
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) * 1e3 / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    from fastdata.data.augment import AugmentConfig, augment_batch

    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--src-size", type=int, default=256)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    x = torch.randint(0, 256, (a.batch_size, a.src_size, a.src_size, 3), dtype=torch.uint8, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for fused in (False, True):
        cfg = AugmentConfig(size=224, dtype="bfloat16", fused=fused)
        t0 = time.perf_counter()
        augment_batch(x, cfg, gen)          # the fused one compiles here
        first = time.perf_counter() - t0
        ms = time_ms(lambda: augment_batch(x, cfg, gen), a.reps, dev)
        rows.append({"augment": "fused (torch.compile)" if fused else "eager", "ms / batch": ms,
                     "img/s": a.batch_size / ms * 1e3, "first call s": first, "device": dev.type})
    notes = (f"Batch {a.batch_size} uint8 {a.src_size}x{a.src_size} NHWC -> RandomResizedCrop 224 + flip + "
             f"normalise -> bf16 channels_last, mean of {a.reps} after warm-up. Rerun: "
             f"`python benchmarks/augment.py`.")
    write("augment", rows, ["augment", "ms / batch", "img/s", "first call s", "device"], notes,
          Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
