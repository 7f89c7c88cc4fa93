"""How far the host runs ahead of the GPU (read/fence.py): the Engine's step fence and the Loader's
max_inflight_batches (3 by default), with fake CUDA events on this CPU machine."""
from __future__ import annotations

import pytest
import torch

import fastdata
from fastdata.errors import LoaderError
from fastdata.read.augment import AugmentConfig

from helpers import epoch_indices


def fake_event_class(log: list | None = None) -> type:
    """torch.cuda.Event's stand-in on this CPU box: instances are numbered as made (the class's `made`
    lists them); record() and synchronize() are appended to log as ("record", n) and ("sync", n)."""
    log = [] if log is None else log

    class FakeEvent:
        made: list = []

        def __init__(self):
            self.n = len(FakeEvent.made)
            FakeEvent.made.append(self)

        def record(self):
            log.append(("record", self.n))

        def synchronize(self):
            log.append(("sync", self.n))

    return FakeEvent


def test_step_fence_waits_on_the_oldest_step_once_the_limit_is_reached():
    from fastdata.read.fence import StepFence

    log = []
    fence = StepFence(2, fake_event_class(log))
    for _ in range(4):
        fence.wait()
        fence.record()
    # steps 0 and 1 run free; before the third and fourth batch the host waits for steps 0 and 1
    assert log == [("record", 0), ("record", 1), ("sync", 0), ("record", 2), ("sync", 1), ("record", 3)]
    assert [e.n for e in fence.pending] == [2, 3]
    none = StepFence(2, None)   # CPU: nothing recorded, nothing waited on
    none.record(), none.wait()
    assert not none.pending


def test_no_event_is_recorded_while_a_cuda_graph_is_captured(monkeypatch):
    """Recording into a stream under capture fails the capture: the fence skips those batches."""
    from fastdata.read.fence import StepFence, cuda_event_factory

    made, event = [], fake_event_class()
    monkeypatch.setattr(torch.cuda, "Event", lambda blocking=False: made.append(blocking) or event())
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    fence = StepFence(1, cuda_event_factory(torch.device("cuda", 0), blocking=True))
    fence.record(), fence.wait()
    assert not made and not fence.pending
    capturing[0] = False
    fence.record()
    assert made == [True] and len(fence.pending) == 1


def test_max_inflight_batches_waits_on_the_batch_before_last_and_keeps_every_sample(raw_cache, monkeypatch):
    """A bounded lead (fence.py): before batch k is handed out the loader waits for the GPU work launched
    up to batch k-1's next() (limit 2); on the CPU the same loader hands out the same samples."""
    from fastdata.read import core

    log = []
    FakeEvent = fake_event_class(log)
    plain = [x.tolist() for x in epoch_indices(fastdata.loader(raw_cache, 16, device="cpu", seed=3))]
    monkeypatch.setattr(core, "cuda_event_factory", lambda device, blocking: FakeEvent)
    dl = fastdata.loader(raw_cache, 16, device="cpu", seed=3, max_inflight_batches=2)
    seen = []
    for batch in dl:
        log.append(("batch", len(seen)))
        seen.append(batch.indices.tolist())
    assert seen == plain and len(seen) == 8
    assert log[:7] == [("record", 0), ("batch", 0), ("record", 1), ("sync", 0), ("batch", 1), ("record", 2),
                       ("sync", 1)]
    assert [e for e in log if e[0] == "sync"] == [("sync", k) for k in range(7)]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_max_inflight_batches_must_be_a_whole_number(raw_cache, bad):
    with pytest.raises(LoaderError, match="max_inflight_batches="):
        fastdata.loader(raw_cache, 8, device="cpu", max_inflight_batches=bad)
    with pytest.raises(LoaderError, match="max_inflight_batches="):
        fastdata.loader(raw_cache, 8, device="cpu").bound_lead(bad)


def test_the_lead_is_bounded_at_three_batches_by_default_and_the_engine_lifts_it_for_its_fit(raw_cache, monkeypatch):
    """Fenced at 3, resnet18 fed from a JPEG cache ran at 90-92% of synthetic against 83-84% unfenced,
    at no cost to a synthetic batch or the raw cache (host-probe-*-2026-12-07-fence3*.md). The Engine
    fences its optimizer steps itself, so its fit() runs the loader unbounded and restores the bound."""
    from fastdata.engine.config import EngineConfig
    from fastdata.engine.engine import Engine
    from fastdata.read import core
    from test_engine import tiny_net

    FakeEvent = fake_event_class()
    made = FakeEvent.made
    monkeypatch.setattr(core, "cuda_event_factory", lambda device, blocking: FakeEvent)
    dl = fastdata.loader(raw_cache, 16, device="cpu", augment=AugmentConfig(size=32, train=False))
    assert dl.cfg.max_inflight_batches == 3 and dl._fence.limit == 3
    seen = []
    eng = Engine(tiny_net(), EngineConfig(precision="fp32", channels_last=False, log_every=1))
    real_fit = eng._fit
    monkeypatch.setattr(eng, "_fit", lambda *a: (seen.append(dl._fence.limit), real_fit(*a))[1])
    assert eng.fit(dl, steps=2)["steps"] == 2
    assert seen == [0] and dl._fence.limit == 3 and not made     # unbounded: no event was recorded
    sum(1 for _ in dl)
    assert len(made) == len(dl)                                   # a plain loop: one event a batch


def test_the_wait_for_the_gpu_is_counted_apart_from_data_wait(raw_cache, monkeypatch):
    """With the lead bounded by default, next() also waits for the GPU. The loader counts that time
    (lead_wait, across bound_lead) and the doctor's meter of next() leaves it out of the data wait."""
    import types

    from fastdata.monitor import script
    from fastdata.read import core, fence

    clock = [0.0]
    fake_time = types.SimpleNamespace(perf_counter=lambda: clock[0])
    monkeypatch.setattr(fence, "time", fake_time)
    monkeypatch.setattr(script, "time", fake_time)

    class SlowGpu:             # each wait for an event takes 2 s of the fake clock
        def record(self):
            pass

        def synchronize(self):
            clock[0] += 2.0

    monkeypatch.setattr(core, "cuda_event_factory", lambda device, blocking: SlowGpu)
    dl = fastdata.loader(raw_cache, 16, device="cpu", max_inflight_batches=2)
    waits = []
    assert sum(1 for _ in script.timed(dl, waits.append)) == 8
    assert dl.lead_wait == 2.0 * 7                  # batches 1..7 each waited for one event
    assert waits == [0.0] * 9                       # ... none of it data wait (the 9th: the epoch's end)
    hooked = []                                     # the bootstrap's hook on Loader.__iter__ (a user's script
    from fastdata.monitor import bootstrap          # under `fastdata doctor`) meters it the same way
    monkeypatch.setattr(bootstrap, "_state", types.SimpleNamespace(
        wait=hooked.append, note_batch=lambda batch: None, note_loader=lambda source, loader: None))
    assert sum(1 for _ in bootstrap._wrap_iter(iter(dl), "fastdata Loader", dl)) == 8
    assert hooked == [0.0] * 9 and dl.lead_wait == 2.0 * (7 + 8)   # (the first pass's events still pending)
    assert dl.bound_lead(0) == 2 and dl.lead_wait == 30.0   # the total survives a new bound
    assert sum(1 for _ in dl) == 8 and dl.lead_wait == 30.0
