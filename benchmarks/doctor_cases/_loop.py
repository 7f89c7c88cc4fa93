"""The plain training loop the planted cases share: a user's own loop, nothing imported from the package."""
import sys
import time

import torch


def train(model, batches, steps: int = 0, autocast=None, lr: float = 0.01) -> None:
    """SGD steps for $CASE_SECONDS seconds (default 20); print the img/s after the first 20 steps."""
    import os

    seconds = float(os.environ.get("CASE_SECONDS", 20))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    it, t0, images, start = iter(batches), None, 0, time.perf_counter()
    step = 0
    while time.perf_counter() - start < seconds:
        if step == 20:
            torch.cuda.synchronize()
            t0, images = time.perf_counter(), 0
        x, y = next(it)
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=autocast or torch.float32, enabled=autocast is not None):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        images += len(x)
        step += 1
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    print(f"img/s {images / wall:.1f} steps/s {(step - 20) / wall:.2f}", file=sys.stderr, flush=True)


def repeat(x, y):
    while True:
        yield x, y
