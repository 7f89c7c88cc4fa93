"""What the doctor's bootstrap measures in a user's process, step by step (bootstrap.py wires it in).

Phases, counted in optimizer steps: warm-up -> timed window (data wait, img/s; the doctor's process
samples NVML and keeps the samples inside this window) -> profiled steps (torch.profiler: GPU busy, H2D share, kernels per step, timeline)
-> report. A script without optimizer steps (inference) is measured per batch instead.
"""
from __future__ import annotations

import json
import os
import time

from .._util import batch_len, first_array


def timed(iterable, on_wait, on_batch=None, loader=None):
    """Yield from iterable, reporting the seconds each next() blocked (the data wait). A fastdata Loader's
    wait for the GPU to catch up (its lead_wait: max_inflight_batches) is GPU backlog and is left out.
    loader: the object iterable iterates (default: iterable itself)."""
    it, owner = iter(iterable), iterable if loader is None else loader
    lead = (lambda: owner.lead_wait) if hasattr(owner, "lead_wait") else (lambda: 0.0)
    while True:
        t, gpu = time.perf_counter(), lead()
        try:
            batch = next(it)
        except StopIteration:
            return
        finally:
            on_wait(max(0.0, time.perf_counter() - t - (lead() - gpu)))
        if on_batch is not None:
            on_batch(batch)
        yield batch


class ScriptState:
    def __init__(self, warmup: int, timed: int, profiled: int, report: str | None, timeline: str | None,
                 min_seconds: float = 0.0, warmup_seconds: float = 0.0, root: bool = True):
        self.root = root     # the command's own process, not one it started
        self.warmup, self.timed, self.profiled, self.min_seconds = warmup, timed, profiled, min_seconds
        self.warmup_seconds, self._first_step = warmup_seconds, 0.0
        self._profile_from = 0
        self.report_path, self.timeline_path = report, timeline
        self.steps = self.batches = 0
        self.features: dict = {}
        self.loaders: list[dict] = []
        self._wait = 0.0
        self._images = 0
        self._t0 = time.perf_counter()
        self._window: dict | None = None
        self._profiler = None
        self._prof_t0 = 0.0
        self._waits: list[tuple[float, float]] = []   # host intervals spent in next(), profiled steps only
        self.result: dict | None = None

    # ---- events from the hooks ------------------------------------------------------------------
    def note_loader(self, source: str, loader) -> None:
        info = {"source": source}
        for attr in ("num_workers", "pin_memory", "batch_size"):
            if hasattr(loader, attr):
                info[attr] = getattr(loader, attr)
        if source.startswith("fastdata"):
            info["pin_memory"] = True
        if info not in self.loaders:
            self.loaders.append(info)

    def wait(self, seconds: float) -> None:
        self._wait += seconds
        if self._profiler is not None:
            now = time.perf_counter()
            self._waits.append((now - seconds, now))

    def note_batch(self, batch) -> None:
        self.batches += 1
        try:
            x = first_array(batch)
            self._images += batch_len(batch)
            if hasattr(x, "is_contiguous") and x.dim() == 4:
                import torch

                if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
                    self.features["channels_last"] = True
        except Exception:  # noqa: BLE001 - a batch of any shape: count what can be counted
            pass

    def step(self) -> None:
        self.steps += 1
        if self.steps == 1:
            self._first_step = time.perf_counter()
        if self._window is None and self.steps >= self.warmup and \
                time.perf_counter() - self._first_step >= self.warmup_seconds:   # fast steps: warm by time too
            self._start_window()
        elif self._window is not None and "wall" not in self._window and \
                self.steps >= self._window["steps"] + self.timed \
                and time.perf_counter() - self._window["t"] >= self.min_seconds:   # GPM needs >= 2 samples
            self._end_window()
            self._start_profile()
            self._profile_from = self.steps
        elif self._profiler is not None and self.steps >= self._profile_from + self.profiled:
            self._end_profile()
            self.finish()

    # ---- phases -----------------------------------------------------------------------------------
    def _sync(self) -> None:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def _start_window(self) -> None:
        self._sync()
        self._window = {"t_mono": time.monotonic(), "t": time.perf_counter(), "wait": self._wait, "images": self._images, "steps": self.steps}

    def _end_window(self) -> None:
        self._sync()
        wall = time.perf_counter() - self._window["t"]
        images = self._images - self._window["images"]
        self._window.update(wall=wall, data_wait_frac=min(1.0, (self._wait - self._window["wait"]) / wall),
                            img_per_s=images / wall, steps_per_s=(self.steps - self._window["steps"]) / wall,
                            t_mono_end=time.monotonic())

    def _start_profile(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._profiler = profile(activities=acts)
        self._profiler.__enter__()
        self._prof_t0 = time.perf_counter()

    def _end_profile(self) -> None:
        from .timeline import fractions

        self._sync()
        wall = time.perf_counter() - self._prof_t0
        prof, self._profiler = self._profiler, None
        prof.__exit__(None, None, None)
        self._window["profile"] = fractions(prof, wall, self.profiled, self._prof_t0, self._waits,
                                            self.timeline_path)

    # ---- report -----------------------------------------------------------------------------------
    def measured(self) -> dict:
        w = self._window or {}
        m = {"steps": self.steps, "batches": self.batches, "features": self.features, "loaders": self.loaders}
        if "wall" in w:
            m.update(data_wait_frac=w["data_wait_frac"], steps_per_s=round(w["steps_per_s"], 2), window_s=round(w["wall"], 2))
            if w["img_per_s"]:   # images are counted where the batches come from a hooked loader
                m["img_per_s"] = round(w["img_per_s"], 1)
            # NVML is sampled by the doctor's own process over these instants (system-wide monotonic
            # clock): no sampler thread in the user's process, whose launch-bound loops it slowed
            m["window_monotonic"] = [w["t_mono"], w["t_mono_end"]]
        else:   # too few steps for the window: the whole run
            wall = max(1e-9, time.perf_counter() - self._t0)
            m.update(data_wait_frac=min(1.0, self._wait / wall), window_s=round(wall, 2), short_run=True)
        m.update(w.get("profile", {}))
        return m

    def finish(self) -> None:
        if self.result is not None:
            return
        if self._profiler is not None:
            self._end_profile()
        if self._window is not None and "wall" not in self._window:
            self._end_window()
        self.result = self.measured()
        if self.report_path and self._reports():   # whole or absent: the doctor stops the command once it sees it
            tmp = f"{self.report_path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(self.result, f, default=str)
            os.replace(tmp, self.report_path)

    def _reports(self) -> bool:
        """Whether this process writes the report. Every Python process the command starts loads the
        doctor (PYTHONPATH is inherited): spawned DataLoader workers, torchrun's launcher. One that
        trained nothing wrote an empty report over the training process's, or before it, which made the
        doctor stop the command and find nothing to diagnose. Such a process writes only where it is the
        command itself and no report exists (a script that exits before training still gets its line)."""
        return bool(self.steps or self.batches) or (self.root and not os.path.exists(self.report_path))
