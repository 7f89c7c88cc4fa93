"""Sample order: shard-aware, rank-aware, deterministic per (seed, epoch), resumable.

Shuffling every sample uniformly makes each batch touch every shard; instead
shards are visited in a random order and samples are shuffled within a window
of consecutive shards' samples. The epoch order is then dealt out to ranks
like cards (rank r takes positions r, r + world, ...): disjoint, equal
length (the last ``N mod world`` samples of each epoch's order are left
out, and which ones rotates with the epoch), and step k of all ranks
together sees exactly the samples one process with world x the batch size
would see, so a DDP run matches a single-process run. The order is a pure function of its inputs, so
state is just (epoch, position) and resume is exact.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import EmptyEpochError, LoaderError


@dataclass(frozen=True)
class OrderConfig:
    shuffle: bool = True
    seed: int = 0
    window: int = 16384      # samples shuffled together (spans several shards)
    rank: int = 0
    world_size: int = 1


def resolve_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit values, else torch.distributed when initialised, else torchrun's RANK/WORLD_SIZE. A
    world_size > 1 given without a rank takes the rank from those too, as DistributedSampler does; with
    none of them every process would read rank 0's share (each sample world_size times), so it is an error."""
    if world_size is not None and world_size < 1:
        raise LoaderError(f"world_size={world_size}: give 1 or more")
    if rank is not None or world_size is not None:
        if rank is None and world_size > 1:
            rank = _rank_from_environment()
            if rank is None:
                raise LoaderError(f"world_size={world_size} without rank=: give each process its rank, or start "
                                  f"them with torchrun (RANK) or torch.distributed")
        return rank or 0, world_size or 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def _rank_from_environment() -> int | None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return int(os.environ["RANK"]) if os.environ.get("RANK", "").isdigit() else None


def epoch_order(shard_counts: list[int], epoch: int, cfg: OrderConfig) -> np.ndarray:
    """Global sample indices this rank visits in this epoch."""
    starts = np.concatenate([[0], np.cumsum(shard_counts)]).astype(np.int64)
    total = int(starts[-1])
    if cfg.world_size > total:
        raise LoaderError(f"{cfg.world_size} ranks but only {total} samples: ranks past {total - 1} would get no data")
    if cfg.shuffle:
        rng = np.random.default_rng([cfg.seed, epoch])
        shard_ids = rng.permutation(len(shard_counts))
        order = np.concatenate([np.arange(starts[s], starts[s + 1]) for s in shard_ids]) if total else \
            np.zeros(0, np.int64)
        for lo in range(0, total, cfg.window):
            seg = order[lo:lo + cfg.window]
            order[lo:lo + cfg.window] = seg[rng.permutation(len(seg))]
    else:
        order = np.arange(total, dtype=np.int64)
    per_rank = total // cfg.world_size
    return order[cfg.rank:per_rank * cfg.world_size:cfg.world_size]


class SampleOrder:
    """Iterates batches of indices; state_dict() counts what was handed out, not what was prefetched."""

    def __init__(self, shard_counts: list[int], batch_size: int, cfg: OrderConfig, drop_last: bool = False):
        if batch_size < 1:
            raise LoaderError(f"batch_size={batch_size}: give a positive batch size")
        if not 0 <= cfg.rank < cfg.world_size:
            raise LoaderError(f"rank {cfg.rank} is outside world_size {cfg.world_size}")
        self.shard_counts, self.batch_size, self.cfg, self.drop_last = list(shard_counts), batch_size, cfg, drop_last
        self.epoch, self.position = 0, 0
        per_rank = sum(self.shard_counts) // cfg.world_size
        if drop_last and 0 < per_rank < batch_size:
            raise EmptyEpochError(f"batch_size={batch_size} with drop_last leaves no batch of the {per_rank} "
                                  f"samples per rank: every epoch would be empty; lower the batch size or set "
                                  f"drop_last=False", per_rank)

    def batches_per_epoch(self) -> int:
        n = sum(self.shard_counts) // self.cfg.world_size
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def epoch_batches(self, epoch: int | None = None, position: int | None = None) -> list[np.ndarray]:
        """Batches still to come in the current epoch from the saved position (or in `epoch` from
        `position`: a loader reading ahead into the next epoch asks without moving the state)."""
        epoch = self.epoch if epoch is None else epoch
        position = self.position if position is None else position
        order = epoch_order(self.shard_counts, epoch, self.cfg)
        end = len(order) - len(order) % self.batch_size if self.drop_last else len(order)
        return [order[i:i + self.batch_size] for i in range(position, end, self.batch_size)]

    def advance(self, n: int) -> None:
        self.position += n

    def next_epoch(self) -> None:
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "seed": self.cfg.seed,
                "world_size": self.cfg.world_size, "rank": self.cfg.rank, "window": self.cfg.window,
                "shuffle": self.cfg.shuffle, "samples": sum(self.shard_counts), "shards": len(self.shard_counts)}

    def load_state_dict(self, state: dict) -> None:
        self.check_state(state)
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def check_state(self, state: dict) -> None:
        """Raise where load_state_dict(state) would be refused, changing nothing. The order is a function of
        these settings and of the data's shard sizes: a state saved for other data (a cache rebuilt from
        other inputs) would resume a different order, silently. Keys a state saved by an earlier fastdata
        lacks are not checked."""
        here = {"samples": sum(self.shard_counts), "shards": len(self.shard_counts)}
        if any(k in state and state[k] != v for k, v in here.items()):
            raise LoaderError(f"loader state was saved for {state.get('samples')} samples in {state.get('shards')} "
                              f"shards but this loader reads {here['samples']} in {here['shards']}; resume with "
                              f"the data the state was saved with, or start afresh (another --ckpt-dir; no "
                              f"load_state_dict)")
        for k in ("seed", "world_size", "rank", "window", "shuffle"):
            if k in ("window", "shuffle") and k not in state:   # saved before these were recorded
                continue
            if state.get(k) != getattr(self.cfg, k):
                raise LoaderError(f"loader state was saved with {k}={state.get(k)} but this loader has "
                                  f"{k}={getattr(self.cfg, k)}; resume with the same settings")
