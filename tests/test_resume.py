"""Resuming: a refused Engine.load changes nothing, and each torchrun rank resumes its own loader state."""
from __future__ import annotations

import copy

import pytest
import torch

import fastdata
from fastdata.engine.config import EngineConfig
from fastdata.engine.engine import Engine
from fastdata.engine.models import SmallNet
from fastdata.read.augment import AugmentConfig


def test_a_refused_load_leaves_the_engine_as_it_was(raw_cache, image_folder, tmp_path):
    """Engine.load restored the model, then found the optimizer (or the loader's data) did not fit and
    raised, leaving a Python caller an engine with the checkpoint's weights and its own optimizer.
    Every part is now checked first: a refused load changes nothing."""
    from fastdata.errors import CheckpointError, LoaderError

    def engine(optimizer="sgd", seed=0):
        torch.manual_seed(seed)
        return Engine(SmallNet(10, width=8), EngineConfig(precision="fp32", optimizer=optimizer, seed=seed))
    dl = fastdata.loader(raw_cache, 16, device="cpu", augment=AugmentConfig(size=32), seed=3)
    saved = engine()
    saved.fit(dl, steps=2, epochs=1)
    saved.save(tmp_path / "ck.pt", dl)
    other = fastdata.loader(raw_cache, 16, device="cpu", augment=AugmentConfig(size=32), seed=4)
    for eng, loader, err in ((engine("adamw", seed=1), None, CheckpointError),
                             (engine(seed=1), other, LoaderError)):
        before = {k: v.clone() for k, v in eng.model.state_dict().items()}
        groups = copy.deepcopy(eng.optimizer.state_dict()["param_groups"])
        with pytest.raises(err):
            eng.load(tmp_path / "ck.pt", loader)
        assert all(torch.equal(before[k], v) for k, v in eng.model.state_dict().items())
        assert eng.optimizer.state_dict() == {"state": {}, "param_groups": groups} and eng.global_step == 0


def test_a_checkpoint_of_other_process_count_is_refused_naming_it(monkeypatch):
    """Each rank resumes its own loader state from a checkpoint that holds them all (rank 1 refused rank 0's
    under torchrun); one saved by another number of processes is a one-line error naming both."""
    from fastdata.engine import distributed
    from fastdata.errors import CheckpointError

    saved = {"per_rank": [{"r": 0}, {"r": 1}]}
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    assert distributed.own_state(saved, "ck.pt") == {"r": 1}
    assert distributed.own_state({"r": 0}, "ck.pt") == {"r": 0}     # a single process's, as saved before
    monkeypatch.setattr(distributed, "world_size", lambda: 4)
    with pytest.raises(CheckpointError, match="ck.pt: saved by 2 processes but this run has 4; resume with "
                                              "--nproc_per_node 2"):
        distributed.own_state(saved, "ck.pt")
