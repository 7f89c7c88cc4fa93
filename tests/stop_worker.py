"""Run by tests under torchrun (gloo, CPU): rank 0 alone asks to stop at its 5th batch, as a signal that
reached it a step before the other rank would; every rank then writes the step it stopped after."""
import sys

import torch

import fastdata
from fastdata.engine import distributed
from fastdata.engine.config import EngineConfig
from fastdata.engine.engine import Engine
from fastdata.read.augment import AugmentConfig

from test_engine import tiny_net  # noqa: E402

cache, out = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
world = int(__import__("os").environ.get("WORLD_SIZE", 1))
dl = fastdata.loader(cache, 8, device="cpu", shuffle=False, augment=AugmentConfig(size=32, train=False),
                     drop_last=True)
eng = Engine(tiny_net(), EngineConfig(precision="fp32", lr=0.05, momentum=0.0, log_every=1, distributed="ddp",
                                      channels_last=False))


class Asking:
    """dl's batches; rank 0 asks the engine to stop as its 6th batch (over epochs) is handed out."""
    handed = 0

    def __len__(self):
        return len(dl)

    def __iter__(self):
        for batch in dl:
            Asking.handed += 1
            if Asking.handed == 6 and distributed.rank() == 0:
                eng.request_stop("SIGINT")
            yield batch


eng.fit(Asking(), steps=40, epochs=10)
eng.save(f"{out}.ck", dl)      # every rank's loader state gathered: a collective that a lone stop hung in
with open(f"{out}.{distributed.rank()}", "w") as f:
    f.write(f"{eng.global_step} {eng.stopped}")
