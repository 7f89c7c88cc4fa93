"""`fastdata doctor -- python script.py` on an unmodified script (CPU), and the five verdict rules."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from torch.utils.data import IterableDataset

from fastdata.cli import main
from fastdata.monitor.doctor import COMPUTE, H2D, INPUT, LAUNCH, SM_UNDERFILLED, diagnose

SCRIPT = '''
import time, torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self): return 10_000
    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.randn(3, 16, 16), i % 10
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(768, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for k, (x, y) in enumerate(DataLoader(Slow(), 8, num_workers=1)):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    if k == 30: break
print("script done")
'''


def test_unmodified_script_is_diagnosed_through_the_bootstrap(tmp_path, monkeypatch, capsys):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    monkeypatch.setenv("FASTDATA_DOCTOR_MIN_SECONDS", "0.5")
    monkeypatch.setenv("FASTDATA_DOCTOR_WARMUP_SECONDS", "0.2")
    out_json, png = tmp_path / "report.json", tmp_path / "timeline.png"
    assert main(["doctor", "--json", str(out_json), "--timeline", str(png), "--warmup-steps", "3",
                 "--timed-steps", "8", "--", sys.executable, str(script)]) == 0
    report = json.loads(out_json.read_text())
    m = report["measured"]
    assert report["verdict"] == INPUT and m["data_wait_frac"] > 0.5
    assert m["features"]["autocast"] == "bfloat16" and m["steps"] >= 3 + 8 + 6
    assert m["loaders"] == [{"source": "torch DataLoader", "num_workers": 1, "pin_memory": False, "batch_size": 8}]
    assert m["profiled_steps"] == 6 and m["window_s"] >= 0.5
    assert png.exists() and png.stat().st_size > 1000
    assert not any("AMP" in what for what, _ in report["fixes"])
    assert "verdict: input-bound" in capsys.readouterr().out


SPAWNED = '''
import time, torch
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self): return 10_000
    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.randn(3, 16, 16), i % 10
if __name__ == "__main__":
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(768, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Slow(), 8, num_workers=2, multiprocessing_context="spawn", persistent_workers=True)
    for k, (x, y) in enumerate(loader):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step(); opt.zero_grad()
        if k == 40: break
'''


def test_spawned_dataloader_workers_do_not_overwrite_the_report(tmp_path, monkeypatch, capsys):
    """Spawned workers (macOS's default, and CUDA scripts' choice) load the doctor too; each wrote an
    empty report at exit, over the training process's: "took no batch ... nothing to diagnose"."""
    script = tmp_path / "train.py"
    script.write_text(SPAWNED)
    monkeypatch.setenv("FASTDATA_DOCTOR_MIN_SECONDS", "0.5")
    monkeypatch.setenv("FASTDATA_DOCTOR_WARMUP_SECONDS", "0.2")
    out_json = tmp_path / "report.json"
    assert main(["doctor", "--json", str(out_json), "--warmup-steps", "3", "--timed-steps", "8", "--",
                 sys.executable, str(script)]) == 0, capsys.readouterr().err
    m = json.loads(out_json.read_text())["measured"]
    assert m["steps"] >= 3 + 8 and m["loaders"][0]["num_workers"] == 2


def _fixes(d):
    return " | ".join(what for what, _ in d.fixes)


def test_five_verdicts_and_fixes_that_fit_the_script():
    script = {"features": {"autocast": "bfloat16", "compile": True, "cuda_graph": True},
              "loaders": [{"source": "torch DataLoader", "num_workers": 8, "pin_memory": True}]}
    assert diagnose({**script, "data_wait_frac": 0.6}).verdict == INPUT
    h2d = diagnose({**script, "data_wait_frac": 0.02, "h2d": 0.5, "gpu_busy": 0.9})
    assert h2d.verdict == H2D and "pin" not in _fixes(h2d) and "uint8" in _fixes(h2d)
    launch = diagnose({**script, "data_wait_frac": 0.02, "h2d": 0.01, "gpu_busy": 0.3})
    assert launch.verdict == LAUNCH and "CUDA graph" not in _fixes(launch) and "compile" not in _fixes(launch)
    fresh = diagnose({"data_wait_frac": 0.02, "h2d": 0.01, "gpu_busy": 0.3})
    assert "CUDA graph" in fresh.fixes[0][0] and abs(fresh.fixes[0][1] - 1 / 0.3) < 1e-6
    under = diagnose({**script, "data_wait_frac": 0.02, "h2d": 0.0, "gpu_busy": 0.98, "duty_cycle": 99.0,
                      "sm_util": 4.0})
    assert under.verdict == SM_UNDERFILLED and under.fixes[0][1] == 3.0
    busy = diagnose({**script, "data_wait_frac": 0.02, "h2d": 0.0, "gpu_busy": 0.98, "duty_cycle": 99.0,
                     "sm_util": 85.0})
    assert busy.verdict == COMPUTE and "AMP" not in _fixes(busy) and "torch.compile" not in _fixes(busy)
    assert "AMP bf16" in diagnose({"data_wait_frac": 0.0, "gpu_busy": 0.99}).fixes[0][0]


def test_a_command_that_is_not_python_is_a_clear_error(capsys):
    assert main(["doctor", "--", "true"]) == 2
    assert "wrote no doctor report" in capsys.readouterr().err


def test_a_script_that_trains_nothing_gets_no_verdict(tmp_path, capsys):
    """It used to be called compute-bound from zero steps and zero batches. One that fails before its first
    batch is told to fix its own error (it was told to give a command that trains)."""
    script = tmp_path / "quits.py"
    script.write_text("import torch\n")
    assert main(["doctor", "--", sys.executable, str(script)]) == 2
    err = capsys.readouterr().err
    assert "(exit 0) took no batch from a DataLoader and made no optimizer step" in err and "verdict" not in err
    script.write_text("import torch\nraise SystemExit(3)\n")
    assert main(["doctor", "--", sys.executable, str(script)]) == 2
    err = capsys.readouterr().err
    assert "failed (exit 3) before its first batch; fix the error it printed" in err and "verdict" not in err


def test_another_interpreter_is_named_when_the_doctor_cannot_attach(tmp_path):
    """The command's python cannot import fastdata: the child says which interpreter has it."""
    import os
    import subprocess

    from fastdata.monitor.bootstrap import write_sitecustomize

    write_sitecustomize(str(tmp_path))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FASTDATA_DOCTOR_REPORT": str(tmp_path / "r.json")}
    out = subprocess.run([sys.executable, "-S", "-c", "import sitecustomize"], env=env, capture_output=True,
                         text=True, cwd=tmp_path)
    assert "cannot import fastdata" in out.stderr and f"e.g. {sys.executable} train.py" in out.stderr


def test_images_are_counted_in_dict_batches_too():
    """A Hugging Face-style {"pixel_values", "labels"} batch was counted as 2 images (len of the dict)."""
    import torch

    from fastdata.monitor.script import ScriptState

    state = ScriptState(1, 1, 0, None, None)
    state.note_batch({"pixel_values": torch.zeros(16, 3, 8, 8), "labels": torch.zeros(16)})
    state.note_batch((torch.zeros(8, 3, 8, 8), torch.zeros(8)))
    state.note_batch(torch.zeros(4, 3, 8, 8))
    assert state.batches == 3 and state._images == 28


def test_a_long_training_run_is_stopped_once_it_is_measured(tmp_path):
    """The doctor waited for the wrapped command to finish: a real training run took hours. Now it stops
    the command (SIGTERM to its process group) once the report is written. A child with a timeout: a
    regression would wait ~200 s for this script."""
    import os
    import subprocess

    script = tmp_path / "train.py"
    script.write_text(SCRIPT.replace("if k == 30: break", "pass"))
    env = {**os.environ, "FASTDATA_DOCTOR_MIN_SECONDS": "0.5", "FASTDATA_DOCTOR_WARMUP_SECONDS": "0.2"}
    out = subprocess.run([sys.executable, "-m", "fastdata.cli", "doctor", "--warmup-steps", "3", "--timed-steps",
                          "8", "--", sys.executable, str(script)], capture_output=True, text=True, env=env,
                         timeout=150)
    assert out.returncode == 0, out.stderr[-1500:]
    assert "verdict: input-bound" in out.stdout and "measured; stopping the command" in out.stderr
    assert "script done" not in out.stdout


def test_planted_case_scripts_are_plain_user_scripts():
    cases = Path(__file__).resolve().parents[1] / "benchmarks" / "doctor_cases"
    for p in cases.glob("*.py"):
        assert "import fastdata" not in p.read_text() and "from fastdata" not in p.read_text(), p
    assert {p.stem for p in cases.glob("*.py")} >= {"input_bound", "h2d_bound", "launch_bound", "sm_underfilled",
                                                     "compute_bound"}


def test_nvml_samples_are_kept_inside_the_scripts_window_only():
    from types import SimpleNamespace

    from fastdata.cli.doctor import _window_gpu

    rows = [{"t": t, "duty_cycle": d, "sm_util": s} for t, d, s in
            [(9.5, 0.0, 0.0), (10.4, 50.0, 5.0), (10.9, 99.0, 2.0), (11.4, 97.0, 2.0), (12.5, 0.0, 0.0)]]
    sampler = SimpleNamespace(samples=rows, cfg=SimpleNamespace(interval_s=0.5))
    assert _window_gpu(sampler, [10.0, 11.5]) == {"duty_cycle": 98.0, "sm_util": 2.0}   # start-up excluded
    assert _window_gpu(sampler, None) == {}


class _Stream(IterableDataset):
    """64 samples; split=True: each DataLoader worker yields its share (get_worker_info), else all of them."""

    def __init__(self, split: bool) -> None:
        self.split = split

    def __iter__(self):
        import torch
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        ids = range(64)
        if self.split and info is not None:
            ids = ids[info.id::info.num_workers]
        for i in ids:
            yield torch.full((3, 4, 4), float(i)), i % 10


def test_the_doctor_warns_when_each_worker_repeats_an_iterable_dataset():
    """torch's classic pitfall: an IterableDataset read by 2 workers without get_worker_info() is read
    twice an epoch. The doctor timed such a script and said nothing; it now compares the first two
    batches and warns, naming the fix, and stays silent for a data set that splits its samples."""
    from torch.utils.data import DataLoader

    from fastdata.monitor.bootstrap import repeats_checked
    from fastdata.monitor.doctor import Diagnosis

    for split in (False, True):
        dl, notes = DataLoader(_Stream(split), batch_size=8, num_workers=2), {}
        seen = sum(len(y) for _, y in repeats_checked(iter(dl), dl, notes))
        assert seen == (64 if split else 128)
        assert ("repeated_batches" in notes) is not split
    text = Diagnosis(INPUT, {"features": {"repeated_batches": "x"}}).text()
    assert text.splitlines()[-1] == "warning: x"
    assert "warning" not in Diagnosis(INPUT, {"features": {}}).text()
