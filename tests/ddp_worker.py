"""Run by tests under torchrun (gloo, CPU): train a BN-free net on a cache; rank 0 saves the weights."""
import faulthandler
import sys

import torch

import fastdata
from fastdata.read.augment import AugmentConfig
from fastdata.engine.config import EngineConfig
from fastdata.engine.engine import Engine

from test_engine import tiny_net  # noqa: E402

cache, out, mode, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
faulthandler.enable(all_threads=True)  # an abort at exit (seen in CI) then shows every thread's stack
torch.manual_seed(0)
world = int(__import__("os").environ.get("WORLD_SIZE", 1))
dl = fastdata.loader(cache, batch // world, device="cpu", shuffle=False,
                     augment=AugmentConfig(size=32, train=False), drop_last=True)
eng = Engine(tiny_net(), EngineConfig(precision="fp32", lr=0.05, momentum=0.0, log_every=1, distributed=mode,
                                      channels_last=False))
report = eng.fit(dl, steps=3)
cov = dl.coverage()
if torch.distributed.is_initialized():
    t = torch.tensor([cov["seen"]])
    torch.distributed.all_reduce(t)
    cov["seen_all_ranks"] = int(t)
state = eng.state_dict(dl)
eng.save(out + ".ck", dl)           # and resumed by a fresh engine on every rank (ZeRO: a full optimizer state)
if torch.distributed.is_initialized():
    torch.distributed.barrier()
again = Engine(tiny_net(), EngineConfig(precision="fp32", lr=0.05, momentum=0.0, log_every=1, distributed=mode,
                                        channels_last=False))
again.load(out + ".ck", dl)
if fastdata.engine.distributed.rank() == 0:
    torch.save({"model": state["model"], "coverage": cov, "losses": [h["loss"] for h in report["history"]],
                "resumed_step": again.global_step}, out)
