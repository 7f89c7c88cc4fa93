"""fastdata.dataloader, the tuned torch DataLoader factory: defaults, autotune, /dev/shm, iterable datasets."""
from __future__ import annotations

import pytest
import torch

import fastdata
from fastdata.errors import LoaderError
from fastdata.read.dataset import CacheDataset


def test_dataloader_factory_defaults_and_autotune(raw_cache):
    dl = fastdata.dataloader(CacheDataset(raw_cache), 16)
    assert dl.num_workers >= 1 and dl.pin_memory == torch.cuda.is_available() and dl.tuning is None
    assert sum(len(y) for _, y in dl) == 120
    tuned = fastdata.dataloader(CacheDataset(raw_cache), 8, autotune_seconds=0.2)
    assert tuned.tuning["chosen"]["workers"] == tuned.num_workers
    rates = [r for _, r in tuned.tuning["measured"]]
    assert len(rates) >= 3 and max(rates) > 0
    best = max(tuned.tuning["measured"], key=lambda r: r[1])
    default = tuned.tuning["measured"][0]
    if best[1] >= default[1] * 1.05:
        assert tuned.tuning["chosen"] == best[0] and tuned.tuning["gain"] > 0
    else:   # no real gain: the default is kept and the report says so
        assert tuned.tuning["chosen"] == default[0] and tuned.tuning["gain"] == 0.0


def test_autotune_stays_within_the_usable_cpus(raw_cache, monkeypatch):
    import warnings

    import fastdata.read.tune as tune

    monkeypatch.setattr(tune, "usable_cpus", lambda: 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # torch's "excessive worker creation" warning fails the test
        tuned = fastdata.dataloader(CacheDataset(raw_cache), 8, autotune_seconds=0.1)
    assert max(c["workers"] for c, _ in tuned.tuning["measured"]) <= 2


class _DictSamples(torch.utils.data.Dataset):
    """Samples as dicts, as Hugging Face datasets give them (module level: workers pickle it)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"pixel_values": torch.full((3, 4, 4), float(i)), "label": i % 3}


def test_autotune_counts_samples_of_dict_batches():
    """measure() took batch[1] as the labels: a dict batch raised KeyError: 1."""
    from fastdata.read.tune import batch_len

    tuned = fastdata.dataloader(_DictSamples(), 8, autotune_seconds=0.1, workers=1)
    assert max(r for _, r in tuned.tuning["measured"]) > 0
    assert batch_len(next(iter(tuned))) == 8 and batch_len((torch.zeros(5, 2), torch.zeros(5))) == 5


def test_a_small_dev_shm_is_warned_about_before_workers_die_of_it(raw_cache, monkeypatch, caplog):
    """Docker's 64 MB /dev/shm: DataLoader workers die with a bare 'Bus error' when it fills."""
    import os
    from types import SimpleNamespace

    import fastdata.read.tune as tune

    real = os.statvfs
    monkeypatch.setattr(tune.os, "statvfs", lambda p: SimpleNamespace(f_blocks=64 << 8, f_frsize=4096))
    with caplog.at_level("WARNING", logger="fastdata.tune"):
        fastdata.dataloader(CacheDataset(raw_cache), 8, workers=1)
    assert "holds only 64 MB" in caplog.text and "--shm-size" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fastdata.tune"):
        fastdata.dataloader(CacheDataset(raw_cache), 8, workers=0)       # no workers: no shared memory
    assert "holds only" not in caplog.text
    monkeypatch.setattr(tune.os, "statvfs", real)
    assert tune.warn_small_shm("/nonexistent/shm") is False


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        for i in range(20):
            yield torch.full((3,), float(i)), i


def test_the_dataloader_factory_takes_an_iterable_dataset_as_torch_does():
    """An IterableDataset failed at once (shuffle=True by default), and the default workers (CPUs - 1)
    would each have yielded every sample: now no shuffle, 0 workers unless given, each sample once."""
    dl = fastdata.dataloader(_Stream(), 8)
    assert dl.num_workers == 0
    assert sorted(int(i) for _, ys in dl for i in ys) == list(range(20))
    assert fastdata.dataloader(_Stream(), 8, workers=2).num_workers == 2       # the user's dataset splits
    with pytest.raises(LoaderError, match="IterableDataset, which orders its own samples"):
        fastdata.dataloader(_Stream(), 8, shuffle=True)
    with pytest.raises(LoaderError, match="autotune cannot tell whether it splits its samples"):
        fastdata.dataloader(_Stream(), 8, autotune_seconds=0.1)
    samples = [(torch.zeros(3), i) for i in range(20)]                   # map-style: shuffled by default
    assert isinstance(fastdata.dataloader(samples, 8, workers=0).sampler, torch.utils.data.RandomSampler)
    assert isinstance(fastdata.dataloader(samples, 8, workers=0, shuffle=False).sampler,
                      torch.utils.data.SequentialSampler)


def test_an_empty_map_dataset_is_named_not_a_sampler_error():
    """torch's DataLoader answers an empty dataset with 'num_samples should be a positive integer value'."""
    import torch.utils.data

    class Empty(torch.utils.data.Dataset):
        def __len__(self):
            return 0

        def __getitem__(self, i):
            raise IndexError(i)

    with pytest.raises(LoaderError, match="Empty has no samples"):
        fastdata.dataloader(Empty(), batch_size=4)
