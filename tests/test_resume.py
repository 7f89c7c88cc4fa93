"""Resuming: a refused Engine.load changes nothing, and each torchrun rank resumes its own loader state."""
from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

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


def test_ranks_stop_after_the_same_step_when_one_is_asked_first(raw_cache, tmp_path):
    """Under torchrun a stop reaches the ranks between different checks: rank 0 returned after step k while
    rank 1 went on into step k+1 and waited in DDP's all-reduce for good. The ranks now vote each step
    (StopVote) and stop after the same one; the checkpoint's gather then finds every rank. The run's
    timeout only bounds the hang this test would otherwise show."""
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": f"{here}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "stop"
    run = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                            str(port), str(here / "stop_worker.py"), str(raw_cache), str(out)], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = run.communicate(timeout=300)
    except subprocess.TimeoutExpired:       # the ranks hung: none of them may outlive the test
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
        pytest.fail("the ranks did not finish in 300 s: one stopped while another waited in a collective")
    assert run.returncode == 0, err[-6000:]
    got = [(tmp_path / f"stop.{k}").read_text().split(" ", 1) for k in (0, 1)]
    assert got[0][0] == got[1][0] == "7"          # asked in rank 0's 6th step, agreed after the next
    assert got[0][1] == "SIGINT" and got[1][1] == "a stop on another rank"

