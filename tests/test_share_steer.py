"""The nvjpeg backend's default CPU share follows the model's pace (share_steer.py).

The steer is checked against a simulated loop on a fake clock: decode processes that decode `cpu` img/s
of the share, a model that takes a batch every 1/`model` s; the training thread waits for a read when
the share's decode of a batch takes longer than the model's step. No timing of this machine enters.
"""
from __future__ import annotations

import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from fastdata.read.backends.share_steer import ShareSteer, SteerConfig

BATCH = 256


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def simulate(steer: ShareSteer, clock: FakeClock, cpu: float, model: float, batches: int) -> list[tuple]:
    """(share, waited) per batch; each batch costs the model's step plus any wait for its read."""
    out = []
    for _ in range(batches):
        step = BATCH / model
        waited = max(0.0, steer.share * BATCH / cpu - step)
        clock.t += step + waited
        out.append((steer.share, waited))
        steer.observe(waited)
    return out


def test_beside_a_model_slower_than_the_processes_the_share_stays_whole():
    clock = FakeClock()
    steer = ShareSteer(1.0, settle=10, clock=clock)
    trace = simulate(steer, clock, cpu=18_500, model=16_300, batches=2000)
    assert steer.changes == 0 and all(s == 1.0 and w == 0.0 for s, w in trace)


def test_a_share_picked_too_small_rises_to_the_whole_batch():
    """Too few processes guessed (or larger images than measured): the processes keep up, so the share
    rises, sparing the model the GPU's decode."""
    clock = FakeClock()
    steer = ShareSteer(0.3, settle=10, clock=clock)
    trace = simulate(steer, clock, cpu=40_000, model=16_300, batches=1000)
    assert trace[-1][0] == 1.0 and sum(w for _, w in trace) == 0.0


@pytest.mark.parametrize("model", [25_000, 40_000])
def test_beside_a_faster_model_the_share_falls_to_what_the_processes_sustain(model):
    """12 processes decode ~18.5k img/s: a share of 1.0 beside a 25k or 40k img/s model would hold it
    to 18.5k. The share settles just under cpu / model, and once settled the loop loses under 2%
    of its time to waits."""
    clock = FakeClock()
    steer = ShareSteer(1.0, settle=10, clock=clock)
    trace = simulate(steer, clock, cpu=18_500, model=model, batches=6000)
    balance = 18_500 / model
    tail = trace[3000:]
    shares = np.array([s for s, _ in tail])
    assert shares.max() <= balance + SteerConfig().step + 1e-9
    assert shares.min() >= balance - 3 * SteerConfig().step
    step_time = len(tail) * BATCH / model
    assert sum(w for _, w in tail) / step_time < 0.02


def test_a_model_that_gets_faster_midway_lowers_the_share():
    clock = FakeClock()
    steer = ShareSteer(1.0, settle=10, clock=clock)
    simulate(steer, clock, cpu=18_500, model=16_000, batches=500)
    assert steer.share == 1.0
    trace = simulate(steer, clock, cpu=18_500, model=30_000, batches=2000)
    assert trace[-1][0] <= 18_500 / 30_000 + SteerConfig().step + 1e-9


def test_batches_in_flight_at_a_change_are_not_counted():
    """After a change the next `settle` batches were split with the old share: their waits neither
    lower the share again nor count in the next window."""
    clock = FakeClock()
    steer = ShareSteer(1.0, settle=12, cfg=SteerConfig(window=4), clock=clock)
    for _ in range(12 + 1):     # the cold start, then the window's first batch (starts its clock)
        clock.t += 0.01
        steer.observe(1.0)      # huge waits, all before a window opened
    assert steer.share == 1.0
    for _ in range(4):
        clock.t += 0.01
        steer.observe(0.02)
    assert steer.share < 1.0 and steer.changes == 1
    share = steer.share
    for _ in range(12):
        clock.t += 0.01
        steer.observe(5.0)
    assert steer.share == share


def test_the_backend_steers_only_a_share_it_picked():
    """cpu_share=None with decode processes: waits the loader reports lower the share the readers split
    with; a share the user gave stays."""
    from fastdata.read.backends.nvjpeg import NvjpegBackend

    steer = ShareSteer(1.0, settle=0, cfg=SteerConfig(window=2))
    me = SimpleNamespace(_steer=steer, _share=1.0)
    for _ in range(3):
        NvjpegBackend.waited(me, 0.5)
    assert me._share < 1.0
    mine = SimpleNamespace(_steer=None, _share=0.7)
    NvjpegBackend.waited(mine, 5.0)
    assert mine._share == 0.7


def _main_thread_in(name: str, main_id: int) -> bool:
    frame = sys._current_frames().get(main_id)
    while frame is not None:
        if frame.f_code.co_name == name and frame.f_code.co_filename.endswith("core.py"):
            return True
        frame = frame.f_back
    return False


def test_the_loader_reports_how_long_the_training_thread_waited_for_each_read(raw_cache):
    """core.Loader tells the backend, per batch, the time it waited for the read: 0.0 for a read done
    before it was asked for, more for one still running. The third read finishes only once the main
    thread is seen waiting for it (no timing margin)."""
    import fastdata

    dl = fastdata.loader(raw_cache, 4, device="cpu", threads=1, prefetch=1, shuffle=False)
    waits, read, calls = [], dl.backend.read, []
    main_id = threading.get_ident()

    def read_third_late(key, idx, slot):
        calls.append(key)
        if len(calls) == 3:
            deadline = time.monotonic() + 60
            while not _main_thread_in("_wait", main_id) and time.monotonic() < deadline:
                time.sleep(0.001)
        return read(key, idx, slot)

    dl.backend.read = read_third_late
    dl.backend.waited = waits.append
    try:
        n = sum(1 for _ in dl)
    finally:
        dl.close()
    assert n >= 3 and len(waits) >= n and all(w >= 0.0 for w in waits)   # (staged ahead: into the next epoch)
    assert waits[2] > 0.0


def test_a_model_that_slows_down_gets_the_whole_share_back_quickly():
    """After a long run at the processes' limit (rises there kept turning out late, so a rise waits up
    to `patience` clean windows), a slower model gets the whole share back within 800 batches: once a
    rise is followed by a clean window, the next rise needs one clean window again."""
    clock = FakeClock()
    steer = ShareSteer(1.0, settle=10, clock=clock)
    simulate(steer, clock, cpu=18_500, model=30_000, batches=4000)
    low = steer.share
    trace = simulate(steer, clock, cpu=18_500, model=10_000, batches=800)
    assert low < 0.7 and trace[-1][0] == 1.0 and sum(w for _, w in trace) == 0.0
