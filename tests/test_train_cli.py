"""`fastdata train` as a user runs it: Ctrl-C and rerun, epochs as a total, seeds, finished runs,
and checkpoints that cannot run code (issues #17, #18, #24)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastdata.cli import main
from fastdata.engine.checkpoint import load_checkpoint, save_checkpoint
from fastdata.errors import CheckpointError

from helpers import build, terminal_signals

ROOT = Path(__file__).resolve().parents[1]


def _train(cache, ck, *extra) -> list[str]:
    return ["train", "--data", str(cache), "--model", "smallnet", "--batch-size", "8", "--image-size", "32",
            "--precision", "fp32", "--lr", "0.01", "--ckpt-dir", str(ck), "--log-every", "1", *extra]


def _step(path) -> int:
    return int(torch.load(path, weights_only=True)["step"])


def test_ctrl_c_saves_a_checkpoint_and_the_same_command_resumes(raw_cache, tmp_path):
    ck = tmp_path / "ck"
    cmd = [sys.executable, "-m", "fastdata.cli", *_train(raw_cache, ck, "--steps", "100000", "--epochs", "100000")]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True,
                            preexec_fn=terminal_signals)
    for line in proc.stderr:   # wait until training runs
        if "step 3 loss" in line:
            break
    os.killpg(proc.pid, signal.SIGINT)
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, err
    assert "Traceback" not in err and "stopped by SIGINT: saved" in err and "rerun the same command" in err
    saved = _step(ck / "last.pt")
    assert saved >= 3
    rerun = [sys.executable, "-m", "fastdata.cli", *_train(raw_cache, ck, "--steps", str(saved + 4))]
    out = subprocess.run(rerun, capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "resuming from" in out.stderr and f"trained {saved + 4} steps" in out.stdout
    assert _step(ck / "last.pt") == saved + 4


def test_a_checkpoint_is_never_replaced_by_an_earlier_step(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 96, "w": torch.ones(2)})
    assert save_checkpoint(path, {"step": 88, "w": torch.zeros(2)}) is None
    assert _step(path) == 96 and torch.load(path, weights_only=True)["w"].sum() == 2


def test_epochs_is_a_total_and_a_finished_run_trains_nothing(raw_cache, tmp_path, capsys):
    ck = tmp_path / "ck"
    per_epoch = -(-120 // 8)
    assert main(_train(raw_cache, ck, "--epochs", "2")) == 0
    assert _step(ck / "last.pt") == 2 * per_epoch
    before = (ck / "last.pt").read_bytes()
    capsys.readouterr()
    assert main(_train(raw_cache, ck, "--epochs", "2")) == 0
    assert "nothing to train" in capsys.readouterr().out and (ck / "last.pt").read_bytes() == before
    assert main(_train(raw_cache, ck, "--epochs", "3")) == 0
    assert _step(ck / "last.pt") == 3 * per_epoch


def test_resume_from_the_final_checkpoint_of_a_steps_run_trains_nothing(raw_cache, tmp_path, capsys):
    ck = tmp_path / "ck"
    assert main(_train(raw_cache, ck, "--steps", "6")) == 0
    before = (ck / "last.pt").read_bytes()
    assert main(_train(raw_cache, ck, "--steps", "6", "--resume", str(ck / "last.pt"))) == 0
    assert (ck / "last.pt").read_bytes() == before and "nothing to train" in capsys.readouterr().out


def test_resume_takes_the_checkpoint_folder_and_a_state_for_other_data_is_refused(raw_cache, image_folder, tmp_path,
                                                                                    capsys):
    """--resume DIR (the folder a run saved into) means DIR/last.pt; a folder without one, and a checkpoint
    whose loader state was saved for other data, are one-line errors (exit 2) that leave last.pt as it was."""
    ck = tmp_path / "ck"
    assert main(_train(raw_cache, ck, "--steps", "4")) == 0
    before = (ck / "last.pt").read_bytes()
    assert main(_train(raw_cache, tmp_path / "other", "--steps", "6", "--resume", str(ck))) == 0
    assert _step(tmp_path / "other" / "last.pt") == 6
    (tmp_path / "empty").mkdir()
    assert main(_train(raw_cache, tmp_path / "x", "--steps", "6", "--resume", str(tmp_path / "empty"))) == 2
    assert "a folder without last.pt" in capsys.readouterr().err
    build(image_folder, tmp_path / "small", shard_size="200KB")
    assert main(_train(tmp_path / "small", ck, "--steps", "6")) == 2
    assert "samples in" in capsys.readouterr().err and (ck / "last.pt").read_bytes() == before


def test_a_checkpoint_of_another_model_or_optimizer_is_a_one_line_error(raw_cache, image_folder, tmp_path, capsys):
    """Resuming with data of fewer classes (another head) or another optimizer raised torch's multi-line
    traceback (exit 1); now one line naming the first mismatch, exit 2, last.pt untouched."""
    ck = tmp_path / "ck"
    assert main(_train(raw_cache, ck, "--steps", "2")) == 0
    before = (ck / "last.pt").read_bytes()
    two = tmp_path / "two"
    for c in ("c0", "c1"):
        (two / c).mkdir(parents=True)
        for p in sorted((image_folder / sorted(os.listdir(image_folder))[0]).iterdir())[:4]:
            (two / c / p.name).write_bytes(p.read_bytes())
    assert main(_train(two, ck, "--steps", "4")) == 2
    err = capsys.readouterr().err
    assert "its model does not fit this run (size mismatch for" in err and len(err.strip().splitlines()) == 1
    assert main(_train(raw_cache, ck, "--steps", "4", "--optimizer", "adamw")) == 2
    assert "its optimizer state does not fit" in capsys.readouterr().err and (ck / "last.pt").read_bytes() == before


def test_same_seed_same_run(raw_cache, tmp_path):
    for name in ("a", "b"):
        assert main(_train(raw_cache, tmp_path / name, "--steps", "3", "--seed", "7")) == 0
    a, b = (torch.load(tmp_path / n / "last.pt", weights_only=True)["model"] for n in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_auto_batch_labels_fit_a_head_with_few_classes(monkeypatch):
    import fastdata.engine.batch_size as bsmod
    from fastdata.cli.train import auto_batch
    from fastdata.engine.config import EngineConfig
    from fastdata.engine.engine import Engine
    from fastdata.engine.models import resolve_model

    def probe(step, device, *a, **k):
        step(16)   # raised IndexError / a CUDA assert when labels were drawn from 0..9
        return 16, [(16, 1.0)]
    monkeypatch.setattr(bsmod, "find_batch_size", probe)
    engine = Engine(resolve_model("smallnet", 3), EngineConfig(precision="fp32", channels_last=False))
    assert auto_batch(engine, 32, 3)[0] == 16


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_checkpoint_that_would_run_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "last.pt"
    torch.save({"step": 1, "model": {}, "x": _Payload(str(marker))}, path)
    with pytest.raises(CheckpointError, match=f"{path}: refused: it asks to unpickle the type posix.system"):
        load_checkpoint(path)
    assert not marker.exists()
    assert main(["train", "--data", "nowhere", "--resume", str(path)]) == 2 and not marker.exists()


def test_old_checkpoint_needs_trust_once(tmp_path):
    import numpy as np

    path = tmp_path / "old.pt"
    torch.save({"step": 5, "rng": {"numpy": np.random.get_state()}}, path)   # what wave 1 wrote
    with pytest.raises(CheckpointError, match="numpy.* --trust-checkpoint"):
        load_checkpoint(path)
    assert load_checkpoint(path, trust=True)["step"] == 5


def _forge_manifest(cache, shard) -> None:
    import json

    from fastdata._util import file_sha256
    from fastdata.cache.format import canonical_sha256

    d = json.loads((cache / "manifest.json").read_text())
    info = next(s for s in d["shards"] if s["name"] == shard.name)
    info.update(bytes=shard.stat().st_size, sha256=file_sha256(shard))
    d["manifest_sha256"] = canonical_sha256(d)
    (cache / "manifest.json").write_text(json.dumps(d))


def test_crafted_pt_shard_is_refused_and_nothing_runs(pt_cache, tmp_path):
    import shutil

    from fastdata.read.dataset import CacheDataset
    from fastdata.errors import CacheFormatError

    cache = tmp_path / "c"
    shutil.copytree(pt_cache, cache)
    marker = tmp_path / "pwned"
    shard = cache / "shard-00000.pt"
    obj = torch.load(shard, weights_only=True)
    obj["keys"] = [_Payload(str(marker))] * len(obj["keys"])
    torch.save(obj, shard)
    _forge_manifest(cache, shard)   # a forger also fixes the manifest, so only the unpickler stands guard
    with pytest.raises(CacheFormatError, match=f"{shard}: refused: this .pt shard asks to unpickle"):
        CacheDataset(cache).cache.shard(0)
    assert not marker.exists()


def test_h5_shard_with_object_references_is_refused(raw_cache, tmp_path):
    import shutil

    import h5py

    from fastdata.read.dataset import CacheDataset
    from fastdata.errors import CacheFormatError

    cache = tmp_path / "c"
    shutil.copytree(raw_cache, cache)
    with h5py.File(cache / "shard-00000.h5", "r+") as f:
        n = len(f["keys"])
        del f["keys"]
        f.create_dataset("keys", (n,), dtype=h5py.ref_dtype)
    _forge_manifest(cache, cache / "shard-00000.h5")
    with pytest.raises(CacheFormatError, match="shard-00000.h5: cannot open shard .*not a fastdata shard"):
        CacheDataset(cache).cache.shard(0)


@pytest.mark.parametrize("precision,dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16),
                                             ("fp32", torch.float32)])
def test_train_ships_batches_in_the_precision_dtype(raw_cache, tmp_path, monkeypatch, precision, dtype):
    """--precision bf16 used to ship float32 batches (issue #20): the loader's dtype follows it."""
    import fastdata.cli.assemble as assemble

    seen = []
    real = assemble.build_loader

    def spy(*args, **kw):
        dl = real(*args, **kw)
        seen.append(next(iter(dl)).images.dtype)
        return dl

    monkeypatch.setattr(assemble, "build_loader", spy)
    args = _train(raw_cache, tmp_path / "ck", "--steps", "1")
    args[args.index("--precision") + 1] = precision
    assert main(args) == 0
    assert seen == [dtype]


def test_make_demo_runs_the_whole_path(tmp_path, capsys):
    """`make demo` (fastdata demo): sample photos -> cache -> loader -> engine steps, end to end."""
    assert main(["demo", "--out", str(tmp_path / "s"), "--per-class", "4", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "build:" in out and "coverage" in out and "train: 3 steps" in out


def test_steps_alone_trains_that_many_steps_across_epochs(raw_cache, tmp_path, capsys):
    """120 samples in batches of 8 are 15 steps an epoch: --steps 20 alone runs into a second epoch
    (Lightning's max_steps), --epochs 1 beside it still ends the run at the epoch's end."""
    assert main(_train(raw_cache, tmp_path / "a", "--steps", "20")) == 0
    assert "trained 20 steps" in capsys.readouterr().out and _step(tmp_path / "a" / "last.pt") == 20
    assert main(_train(raw_cache, tmp_path / "b", "--steps", "20", "--epochs", "1")) == 0
    assert "trained 15 steps" in capsys.readouterr().out and _step(tmp_path / "b" / "last.pt") == 15
    assert main(_train(raw_cache, tmp_path / "c", "--steps", "3")) == 0
    assert "no rate: every step was a warm-up step" in capsys.readouterr().out


def test_a_full_disk_at_a_checkpoint_is_one_line_and_keeps_the_previous_one(tmp_path, monkeypatch):
    import fastdata.engine.checkpoint as checkpoint

    path = tmp_path / "last.pt"
    save_checkpoint(path, {"step": 1})
    before = path.read_bytes()

    def full(obj, f):
        Path(f).write_bytes(b"PK half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.torch, "save", full)
    with pytest.raises(CheckpointError, match=r"last.pt: cannot save checkpoint \(No space left on device\); "
                                              r"the previous checkpoint there is intact"):
        save_checkpoint(path, {"step": 2})
    assert path.read_bytes() == before and not (tmp_path / "last.pt.tmp").exists()


def test_an_unwritable_ckpt_dir_stops_the_run_before_it_trains(raw_cache, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    assert main(_train(raw_cache, blocker / "ck", "--steps", "2")) == 2
    err = capsys.readouterr().err
    assert f"{blocker / 'ck'}: cannot write checkpoints there" in err and "choose another --ckpt-dir" in err
    assert "step 1 loss" not in err


def test_auto_batch_size_is_capped_at_the_samples_an_epoch_gives(raw_cache, monkeypatch):
    """The search runs on synthetic input and chose 1,024-2,048 on the CPU box for a 150-image set:
    one short batch an epoch. The batch is now at most this rank's share of the data. (The search
    itself is timing-dependent; it is replaced here by what it chose there.)"""
    import fastdata.cli.train as train
    from fastdata.cli.assemble import RunConfig, assemble
    from fastdata.engine.config import EngineConfig

    monkeypatch.setattr(train, "auto_batch", lambda engine, size, classes: (2048, None))

    run = assemble(RunConfig(data=str(raw_cache), model="smallnet", batch_size="auto", image_size=32,
                             engine=EngineConfig(precision="fp32")))
    assert run.batch_size == 120 and run.loader.cfg.batch_size == 120 and len(run.loader) == 1
    run.loader.close()


def test_running_out_of_gpu_memory_is_one_line_naming_the_fix(raw_cache, tmp_path, monkeypatch, capsys):
    """A CUDA OOM at a fixed --batch-size was a torch traceback; any other RuntimeError still raises."""
    import fastdata.cli.assemble as train_cli

    def oom(*a, **kw):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)\nmore")

    monkeypatch.setattr(train_cli, "assemble", oom)
    assert main(_train(raw_cache, tmp_path / "ck")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "the GPU ran out of memory" in err and "--batch-size auto" in err

    def other(*a, **kw):
        raise RuntimeError("a model bug")

    monkeypatch.setattr(train_cli, "assemble", other)
    with pytest.raises(RuntimeError, match="a model bug"):
        main(_train(raw_cache, tmp_path / "ck"))


def test_train_takes_every_source_the_loader_reads(image_folder, tmp_path, monkeypatch):
    """`--data list.csv` or a .tar was refused ("neither a fastdata cache nor an image folder"), and
    classes were counted as sub-folders; now from the label map the loader uses."""
    import tarfile

    from fastdata.read.select import num_classes

    photos = sorted(image_folder.rglob("*.jpg"))[:6]
    lst = tmp_path / "list.csv"
    lst.write_text("path,label\n" + "".join(f"{p},{'cat' if k % 2 else 'dog'}\n" for k, p in enumerate(photos)))
    tar = tmp_path / "shard.tar"
    with tarfile.open(tar, "w") as tf:
        for k, p in enumerate(photos):
            tf.add(p, f"{k:03d}.jpg")
            data = str(k % 3).encode()
            info = tarfile.TarInfo(f"{k:03d}.cls")
            info.size = len(data)
            tf.addfile(info, __import__("io").BytesIO(data))
    assert (num_classes(lst), num_classes(tar), num_classes(image_folder)) == (2, 3, 10)
    for data in (lst, tar):
        args = ["train", "--data", str(data), "--model", "smallnet", "--batch-size", "2", "--image-size", "32",
                "--precision", "fp32", "--steps", "2", "--ckpt-dir", str(tmp_path / f"ck-{data.suffix[1:]}")]
        assert main(args) == 0


def test_train_takes_allow_empty_classes_as_build_cache_does(image_folder, tmp_path, capsys):
    """An empty class folder: train's error told the user to pass --allow-empty-classes, which train
    did not take."""
    import shutil

    src = tmp_path / "src"
    for c in ("a", "b"):
        (src / c).mkdir(parents=True)
        for p in sorted(image_folder.rglob("*.jpg"))[:3]:
            shutil.copy(p, src / c / p.name)
    (src / "c_empty").mkdir()
    args = ["train", "--data", str(src), "--model", "smallnet", "--batch-size", "2", "--image-size", "32",
            "--precision", "fp32", "--steps", "2", "--ckpt-dir", str(tmp_path / "ck")]
    assert main(args) == 2 and "--allow-empty-classes" in capsys.readouterr().err
    assert main(args + ["--allow-empty-classes"]) == 0


def test_a_signal_the_launcher_ignored_stays_ignored_while_training():
    """A shell script's background job starts with SIGINT ignored (the Ctrl-C meant for the script): train takes
    over SIGTERM but leaves that SIGINT ignored, as Python's own handler would; otherwise both stop the run."""
    from fastdata.cli.train import _stop_on_signals

    class Stub:
        stopped = None

        def request_stop(self, why):
            self.stopped = why

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        with _stop_on_signals(Stub()):
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert callable(signal.getsignal(signal.SIGTERM))
        signal.signal(signal.SIGINT, signal.default_int_handler)
        stub = Stub()
        with _stop_on_signals(stub):
            signal.raise_signal(signal.SIGINT)
        assert stub.stopped == "SIGINT" and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        for s, h in before.items():
            signal.signal(s, h)


@pytest.mark.parametrize("flag", ["--steps", "--epochs"])
def test_a_negative_total_is_refused_not_taken_as_nothing_to_train(raw_cache, tmp_path, flag, capsys):
    with pytest.raises(SystemExit) as e:
        main(_train(raw_cache, tmp_path / "ck", flag, "-1"))
    assert e.value.code == 2 and "give 0 or more" in capsys.readouterr().err
    assert not (tmp_path / "ck").exists()


def test_training_batches_are_full_so_batchnorm_never_sees_one_sample(image_folder, tmp_path):
    """9 samples at batch 8 ended each epoch with a 1-sample batch, and BatchNorm raised "Expected more than
    1 value per channel" (a traceback, exit 1). The run's loader drops the short batch; where one batch is
    more than the data, the epoch is that one short batch (auto: a batch of all of it)."""
    from fastdata.cli.assemble import RunConfig, assemble
    from fastdata.engine.config import EngineConfig

    src = tmp_path / "nine"
    photos = sorted(image_folder.rglob("*.jpg"))[:9]
    for k, p in enumerate(photos):
        (src / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        (src / f"c{k % 2}" / p.name).write_bytes(p.read_bytes())
    build(src, tmp_path / "c", size=32)
    assert main(["train", "--data", str(tmp_path / "c"), "--model", "resnet18", "--batch-size", "8",
                 "--image-size", "32", "--precision", "fp32", "--epochs", "2", "--no-channels-last"]) == 0
    engine = EngineConfig(precision="fp32", channels_last=False)
    run = assemble(RunConfig(data=str(tmp_path / "c"), model="smallnet", batch_size=8, image_size=32, engine=engine))
    assert [len(b.labels) for b in run.loader] == [8]
    run = assemble(RunConfig(data=str(tmp_path / "c"), model="smallnet", batch_size=16, image_size=32, engine=engine))
    assert [len(b.labels) for b in run.loader] == [9] and run.batch_size == 16
