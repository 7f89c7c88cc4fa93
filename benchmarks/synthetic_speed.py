"""How fast each model trains on a batch already on the GPU: which models outrun a loader's decoders.

    python benchmarks/synthetic_speed.py --models resnet10t,mobilenetv3_small_100,resnet18 [--seconds 4]

The same plain loop as models.py (timm, 100 classes, batch 256, bf16 autocast, channels_last,
torch.compile default, SGD), on its synthetic batch only: no data is made, so a GPU call can size
several models in a minute or two. Picks the models for the loader rows of host_probe.py.
"""
from __future__ import annotations

import argparse
import time

import torch

from _common import write
from models import SyntheticBatches, make_model, plain_loop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    rows = []
    for name in a.models.split(","):
        t0 = time.perf_counter()
        model = make_model(name).to(dev, memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        rate = plain_loop(torch.compile(model), opt, SyntheticBatches(a.batch_size, dev), a.seconds, 15, dev)
        rows.append({"model": name, "img/s": rate, "params (M)": sum(p.numel() for p in model.parameters()) / 1e6,
                     "compile + run s": time.perf_counter() - t0})
        print(rows[-1], flush=True)
        del model, opt
        torch.cuda.empty_cache()
    write("synthetic-speed", rows, ["model", "img/s", "params (M)", "compile + run s"],
          f"Synthetic bf16 batch {a.batch_size} on the GPU, plain loop compiled, {a.seconds:.0f} s per model. "
          f"Rerun: `python benchmarks/synthetic_speed.py --models {a.models}`.",
          None if a.out is None else __import__("pathlib").Path(a.out))


if __name__ == "__main__":
    main()
