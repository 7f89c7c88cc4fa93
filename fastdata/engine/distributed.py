"""DDP / ZeRO set-up from torchrun's environment; gloo on CPU, NCCL on GPU."""
from __future__ import annotations

import atexit
import logging
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from ..errors import CheckpointError
from .config import EngineConfig
from .step import make_optimizer

log = logging.getLogger("fastdata.engine")


def init_from_env(device_type: str) -> bool:
    """Join the process group torchrun describes (WORLD_SIZE > 1). True when distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size() > 1
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    atexit.register(_leave)
    return True


LEAVE_BARRIER_S = 10.0   # a clean run's ranks end within seconds of each other; a failed one is not waited on long


def _leave() -> None:
    """Tear down the process group we joined before the interpreter exits, as torch asks
    (destroy_process_group at the end of a run) instead of leaving it to static destruction.

    Gloo first meets the other ranks at a barrier, waited for with the GIL released. Why: a gloo
    worker thread drops its last reference to a finished collective (the run's last all_reduce)
    only once it gets the GIL, to release the tensors' Python objects; if the interpreter is already
    finalizing by then, that thread is made to exit mid-destructor and the process aborts
    ("terminate called without an active exception", a core dump showed ProcessGroupGloo::AsyncWork's
    destructor in take_gil). DDP and ZeRO keep the group alive past destroy_process_group, so it is
    not joined here. The barrier is bounded: a rank that failed must not make the others hang."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "gloo":
        try:
            dist.barrier(async_op=True).wait(timeout=timedelta(seconds=LEAVE_BARRIER_S))
        except Exception as e:  # noqa: BLE001 - a peer gone or late: leave anyway, as before
            log.debug("barrier before leaving the process group: %s", e)
    dist.destroy_process_group()


def local_device() -> torch.device:
    if torch.cuda.is_available():
        idx = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    return torch.device("cpu")


def wrap(model: nn.Module, cfg: EngineConfig, device: torch.device, distributed: bool):
    """(model, optimizer): DDP-wrapped and ZeRO-sharded as configured."""
    mode = cfg.distributed if cfg.distributed != "auto" else ("ddp" if distributed else "none")
    if mode != "none" and distributed:
        ids = [device.index] if device.type == "cuda" else None
        model = nn.parallel.DistributedDataParallel(model, device_ids=ids)
    if mode == "zero" and distributed:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.SGD
        extra = {} if cfg.optimizer == "adamw" else {"momentum": cfg.momentum}
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, lr=cfg.lr,
                                      weight_decay=cfg.weight_decay, **extra)
        return model, opt
    return model, make_optimizer(model.parameters(), cfg, device)


def all_agree_min(value: int, device: torch.device) -> int:
    """The smallest value over all ranks (every rank must pick the same batch size)."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    t = torch.tensor([value], device=device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def per_rank(state):
    """Every rank's `state` (a loader's: its position and its own samples' coverage), in rank order, on
    every rank; None with one process. A checkpoint keeps them all, so that each rank resumes its own:
    rank 0's alone was refused by rank 1 ("saved with rank=0"). A collective: every rank calls it."""
    if world_size() == 1:
        return None
    out = [None] * world_size()
    dist.all_gather_object(out, state)
    return out


def own_state(saved, path):
    """This rank's loader state from a checkpoint's (per_rank: one a rank; or one, from a single process)."""
    if not (isinstance(saved, dict) and "per_rank" in saved):
        return saved
    states = saved["per_rank"]
    if len(states) != world_size():
        raise CheckpointError(f"{path}: saved by {len(states)} processes but this run has {world_size()}; resume "
                              f"with --nproc_per_node {len(states)} (the loader's order depends on it), or start "
                              f"afresh with another --ckpt-dir")
    return states[rank()]


class StopVote:
    """The ranks agree on the step to stop at. A stop (a signal, request_stop(), a time limit) reaches each
    rank between different checks: one that returned after step k while another went on into step k+1
    left that one waiting in DDP's all-reduce (and, since checkpoints gather every rank's loader state,
    the saving one in its gather). Each step's local wish is summed over the ranks by an all-reduce on a
    gloo group, started without waiting and read one step later, when it is long done: no GPU sync, and
    every rank stops after the same step, one step after the first asked."""

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo")   # (CPU tensors beside NCCL's; a collective: every rank)
        self.pending = None

    def vote(self, stop: bool) -> bool:
        """Every rank calls this after each optimizer step; True once the ranks have agreed to stop."""
        agreed = self.drain()
        wish = torch.tensor([int(stop)])
        self.pending = (dist.all_reduce(wish, group=self.group, async_op=True), wish)
        return agreed

    def drain(self) -> bool:
        """Wait for the vote in flight (every rank started it): whether any rank asked to stop in it."""
        if self.pending is None:
            return False
        work, wish = self.pending
        self.pending = None
        work.wait()
        return bool(wish.item())

