"""The doctor inside an unmodified script: `fastdata doctor -- python train.py` loads this at start-up.

The doctor puts a folder holding a ``sitecustomize.py`` first on PYTHONPATH; Python imports it
before the script, and it calls ``install()``, which hooks, without touching the script:

* loaders: every ``torch.utils.data.DataLoader`` and fastdata loader iterator is timed per
  ``next()`` (the data wait), and its worker count and pin_memory are recorded;
* steps: a global optimizer step hook (``register_optimizer_step_post_hook``) marks each step;
* what the script already uses: ``torch.autocast`` dtypes, ``torch.compile`` calls, CUDA graph
  replays, pinned memory, workers, channels_last batches.

Timeline per process: WARMUP steps and WARMUP_SECONDS (compilation, cudnn autotuning), then a TIMED window of steps
(data wait, steps/s; the doctor process keeps its NVML samples to exactly that window), then a few
PROFILED steps under torch.profiler (GPU busy, H2D share, kernels per step, a timeline). The timed
window never includes the profiler, so the doctor's cost there is a timer per batch and a hook per
step. The report is written to $FASTDATA_DOCTOR_REPORT after the profiled steps (or at exit).
"""
from __future__ import annotations

import atexit
import json
import os
import sys

from .._util import first_array
from .script import ScriptState, timed

WARMUP = int(os.environ.get("FASTDATA_DOCTOR_WARMUP", 10))
TIMED = int(os.environ.get("FASTDATA_DOCTOR_TIMED", 30))
PROFILED = int(os.environ.get("FASTDATA_DOCTOR_PROFILED", 6))
MIN_SECONDS = float(os.environ.get("FASTDATA_DOCTOR_MIN_SECONDS", 3.0))   # the timed window's least length
WARMUP_SECONDS = float(os.environ.get("FASTDATA_DOCTOR_WARMUP_SECONDS", 2.0))   # and the warm-up's

_state: ScriptState | None = None


def _wrap_iter(it, source: str, loader=None):
    _state.note_loader(source, loader)
    return timed(it, _state.wait, _state.note_batch, loader)


def repeats_checked(it, loader, notes: dict):
    """Batches of `it`, the first two compared where `loader` is a torch DataLoader whose workers each
    iterate an IterableDataset: unless its __iter__ splits the samples (get_worker_info), every worker
    yields all of them, so batch 0 (worker 0) and batch 1 (worker 1) are the same, and an epoch sees each
    sample num_workers times. Identical tensors are noted in `notes` (the report's features)."""
    from torch.utils.data import IterableDataset

    workers = getattr(loader, "num_workers", 0)
    if workers < 2 or not isinstance(getattr(loader, "dataset", None), IterableDataset):
        yield from it
        return
    first = None
    for k, batch in enumerate(it):
        if k == 0:
            first = _snapshot(batch)
        elif k == 1 and _same(first, _snapshot(batch)):
            notes["repeated_batches"] = (f"the first two batches of a DataLoader over {type(loader.dataset).__name__} "
                                         f"(an IterableDataset) with {workers} workers are identical: each worker "
                                         f"yields every sample unless __iter__ splits them by "
                                         f"torch.utils.data.get_worker_info(), so an epoch repeats each {workers} "
                                         f"times")
        yield batch


def _snapshot(batch):
    """A CPU copy of the batch's first array, or None where it has none that torch takes."""
    import torch

    try:
        return torch.as_tensor(first_array(batch)).detach().cpu().clone()
    except Exception:  # noqa: BLE001 - a batch of any shape: a check that cannot run says nothing
        return None


def _same(a, b) -> bool:
    return a is not None and b is not None and a.shape == b.shape and a.dtype == b.dtype and bool((a == b).all())


def _hook_loaders() -> None:
    from torch.utils.data import DataLoader

    original = DataLoader.__iter__

    def timed_iter(self):
        return _wrap_iter(repeats_checked(iter(original(self)), self, _state.features), "torch DataLoader", self)

    DataLoader.__iter__ = timed_iter
    for module, cls in (("fastdata.read.core", "Loader"),):
        try:
            klass = getattr(__import__(module, fromlist=[cls]), cls)
        except Exception:  # noqa: BLE001 - an optional backend that is missing
            continue
        orig = klass.__iter__
        klass.__iter__ = lambda self, _o=orig, _n=cls: _wrap_iter(iter(_o(self)), f"fastdata {_n}", self)


def _hook_features() -> None:
    import torch

    st = _state
    orig_autocast_init = torch.autocast.__init__

    def autocast_init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        orig_autocast_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        if enabled:
            st.features["autocast"] = str(self.fast_dtype).replace("torch.", "")

    torch.autocast.__init__ = autocast_init
    orig_compile = torch.compile

    def compile_(*a, **k):
        st.features["compile"] = True
        return orig_compile(*a, **k)

    torch.compile = compile_
    graph_replay = torch.cuda.CUDAGraph.replay

    def replay(self):
        st.features["cuda_graph"] = True
        return graph_replay(self)

    torch.cuda.CUDAGraph.replay = replay
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda opt, args, kwargs: st.step())


def install() -> None:
    """Hook the running interpreter (called by the doctor's sitecustomize)."""
    global _state
    if _state is not None:
        return
    # the first Python process of the command marks itself; the processes it starts inherit the mark
    root = os.environ.setdefault("FASTDATA_DOCTOR_ROOT", str(os.getpid())) == str(os.getpid())
    _state = ScriptState(WARMUP, TIMED, PROFILED, os.environ.get("FASTDATA_DOCTOR_REPORT"),
                         os.environ.get("FASTDATA_DOCTOR_TIMELINE"), MIN_SECONDS, WARMUP_SECONDS, root=root)
    _hook_features()
    _hook_loaders()
    atexit.register(_state.finish)


def write_sitecustomize(folder: str) -> None:
    """The folder the doctor puts first on PYTHONPATH for the child process."""
    with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
        f.write("try:\n    from fastdata.monitor.bootstrap import install\n    install()\n"
                "except ImportError as e:  # another interpreter than fastdata's: say which, and which has it\n"
                "    import sys\n    print(f'fastdata doctor: not attached: {sys.executable} cannot import fastdata "
                f"({{e}}); run the command with the Python fastdata is installed in, e.g. {sys.executable} "
                "train.py, or activate that environment first', file=sys.stderr)\n"
                "except Exception as e:  # never break the user's script\n"
                "    import sys\n    print(f'fastdata doctor: not attached ({e})', file=sys.stderr)\n")


def read_report(path: str) -> dict:
    with open(path) as f:
        return json.load(f)
