"""`fastdata doctor`: where does step time go, what is the bottleneck, which fix first.

Measured per run: data wait (host blocked in ``next(loader)``), host-to-
device copy and GPU-busy share (profiler timeline), duty cycle and SM
activity (NVML/GPM). The verdict is the first rule that holds:

  input-bound     data wait >= 25% of wall time
  h2d-bound       host-to-device copies cover >= 20% of wall time
  launch-bound    GPU busy < 70% of wall time although data is ready: idle between kernels
  SM-underfilled  the GPU is busy (duty cycle >= 70%) but GPM SM activity < 50%: small kernels
                  or low occupancy (one SM at 100% reads as 100% duty cycle)
  compute-bound   otherwise

Fixes are ranked by the gain they can bring, estimated from the measured
fractions (removing a stall of fraction f speeds up by 1 / (1 - f)) and,
for compute-bound runs, from the ratios measured on an H200 with ResNet-50
(bf16 vs fp32 2.1x, compile 1.46x).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

INPUT, H2D, LAUNCH, COMPUTE = "input-bound", "h2d-bound", "launch-bound", "compute-bound"
SM_UNDERFILLED = "SM-underfilled"


@dataclass
class Diagnosis:
    verdict: str
    measured: dict
    fixes: list[tuple[str, float]] = field(default_factory=list)  # (what to do, expected speed-up)

    def text(self) -> str:
        m = self.measured
        parts = [f"{k}={v:.0%}" if isinstance(v, float) and k.endswith(("frac", "busy", "h2d")) else f"{k}={v}"
                 for k, v in m.items() if v is not None]
        lines = [f"verdict: {self.verdict}", "measured: " + ", ".join(parts), "fixes, best first:"]
        lines += [f"  {i}. {what} (expected up to {gain:.1f}x)" for i, (what, gain) in enumerate(self.fixes, 1)]
        repeated = (m.get("features") or {}).get("repeated_batches")
        if repeated:    # a correctness problem the speed verdict does not show (bootstrap.repeats_checked)
            lines.append(f"warning: {repeated}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"verdict": self.verdict, "measured": self.measured, "fixes": self.fixes}


def _gain(frac: float) -> float:
    return 1.0 / max(1e-3, 1.0 - min(frac, 0.999))


def _uses(m: dict) -> dict:
    """What the run already does, from the engine's settings or the script's detected features."""
    f, loaders = m.get("features", {}), m.get("loaders", [])
    return {"amp": f.get("autocast") in ("bfloat16", "float16") or m.get("precision") in ("bf16", "fp16"),
            "compile": bool(f.get("compile") or m.get("compiled")),
            "cuda_graph": bool(f.get("cuda_graph") or m.get("cuda_graph")),
            "pinned": any(bool(x.get("pin_memory")) for x in loaders) or bool(m.get("pinned")),
            "fastdata": any(str(x.get("source", "")).startswith("fastdata") for x in loaders),
            "workers": max([int(x.get("num_workers", 0)) for x in loaders] or [0]),
            "channels_last": bool(f.get("channels_last") or m.get("channels_last"))}


def _input_fixes(m: dict, u: dict) -> list:
    g = _gain(m.get("data_wait_frac", 0.0))
    fixes = []
    if not u["fastdata"]:
        fixes.append(("decode once: `fastdata build-cache`, then fastdata.loader (uint8 to the GPU, augment there)", g))
        fixes.append(("decode on the GPU: fastdata.decode_loader(folder, backend='dali' or 'nvjpeg')", g))
        fixes.append(("more DataLoader workers, pin_memory=True: fastdata.dataloader(..., autotune_seconds=2)"
                      f" (now {u['workers']} workers)", min(g, 2.0)))
    else:
        fixes.append(("a raw cache in RAM (or `fastdata stage` to tmpfs), more reader threads", g))
    return fixes


def _rules(m: dict, u: dict):
    wait, h2d, duty, sm = m.get("data_wait_frac", 0.0), m.get("h2d"), m.get("duty_cycle"), m.get("sm_util")
    # idle between kernels: NVML's duty cycle over the timed window where there is one (the profiler's
    # own overhead shrinks the busy share it sees: 31% for a GPU that NVML saw 99.4% busy)
    busy = duty / 100 if duty is not None else m.get("gpu_busy")
    if wait >= 0.25:
        return INPUT, _input_fixes(m, u)
    if h2d is not None and h2d >= 0.2:
        fixes = [] if u["pinned"] else [("pin host memory (pin_memory=True) and copy with non_blocking=True",
                                         _gain(h2d * 0.6))]
        fixes.append(("ship uint8 and normalise on the GPU: 4x fewer bytes than float32 (fastdata.loader does)",
                      _gain(h2d * 0.75)))
        return H2D, fixes
    if busy is not None and busy < 0.7:
        fixes = [] if u["cuda_graph"] else [("capture the step as a CUDA graph: EngineConfig(cuda_graph=True)",
                                             _gain(1 - busy))]
        if not u["compile"]:
            fixes.append(("torch.compile to fuse kernels: EngineConfig(compile='default')", min(1.46, _gain(1 - busy))))
        fixes.append(("a larger batch (batch_size='auto') amortises launches", min(2.0, _gain(1 - busy))))
        return LAUNCH, fixes
    busy_pct = busy * 100 if busy is not None else None
    if sm is not None and busy_pct is not None and busy_pct >= 70 and sm < 50:
        gain = min(3.0, busy_pct / max(sm, 1.0))
        fixes = [("a larger batch (batch_size='auto'): more blocks per kernel fill more SMs", gain)]
        if not u["compile"]:
            fixes.append(("torch.compile: fused kernels with better occupancy", min(1.46, gain)))
        return SM_UNDERFILLED, fixes
    fixes = []
    if not u["amp"]:
        fixes.append(("AMP bf16 + channels_last: EngineConfig(precision='bf16')", 2.1))
    if not u["compile"]:
        fixes.append(("torch.compile: EngineConfig(compile='default')", 1.46))
    if not u["channels_last"] and not u["amp"]:
        fixes.append(("channels_last memory format for convolutions", 1.1))
    fixes.append(("batch size search: batch_size='auto' (throughput, not just fit)", 1.05))
    return COMPUTE, fixes


def diagnose(m: dict) -> Diagnosis:
    """m: data_wait_frac, and where measured: h2d, gpu_busy, duty_cycle, sm_util (percent), what the run
    uses (precision/compiled/cuda_graph/pinned, or the bootstrap's features and loaders). The fixes never
    suggest what the run already does; gains come from the measured fractions."""
    verdict, fixes = _rules(m, _uses(m))
    return Diagnosis(verdict, m, sorted(fixes, key=lambda f: -f[1]))


def run_doctor(engine, loader, seconds: float = 20.0, profile: bool = True) -> Diagnosis:
    """Train for a bounded time with the engine, profile a few steps on GPU, diagnose."""
    report = engine.fit(loader, time_limit=seconds, epochs=10**6, warmup_steps=3)
    m = {"img_per_s": round(report["img_per_s"], 1), "data_wait_frac": report["data_wait_frac"],
         "precision": engine.cfg.precision, "compiled": engine.cfg.compile != "off",
         "cuda_graph": report["cuda_graph"]}
    gpu = report.get("gpu", {})
    m.update({k: round(gpu[k], 1) for k in ("duty_cycle", "sm_util") if k in gpu})
    if profile and engine.device.type == "cuda":
        it = iter(loader)

        def step():
            nonlocal it
            try:
                batch = next(it)
            except StopIteration:
                it = iter(loader)
                batch = next(it)
            engine.train_step(batch)
        m.update(profile_fractions(step))
    return diagnose(m)


def profile_fractions(step) -> dict:
    from .profile import profile_steps

    p = profile_steps(step, steps=8)
    return {"gpu_busy": p["gpu_busy"], "h2d": p["h2d"]}


class Watch:
    """Doctor for your own loop: wrap the loader, mark steps, get a Diagnosis.

        w = Watch()
        for images, labels in w.loader(train_loader):
            ...            # your step
            w.step()
        print(w.diagnosis().text())

    Under `fastdata doctor -- python train.py`, the measurements are also written to
    $FASTDATA_DOCTOR_REPORT when the process exits, for the wrapper to combine with NVML.
    """

    def __init__(self) -> None:
        self.wait = 0.0
        self.steps = 0
        self.t0 = time.perf_counter()
        path = os.environ.get("FASTDATA_DOCTOR_REPORT")
        from . import bootstrap

        if path and bootstrap._state is None:   # under the bootstrap, its richer report is the one written
            import atexit

            atexit.register(lambda: open(path, "w").write(json.dumps(self.measured())))

    def loader(self, iterable):
        from .script import timed

        def waited(seconds: float) -> None:
            self.wait += seconds
        return timed(iterable, waited)

    def step(self) -> None:
        self.steps += 1

    def measured(self) -> dict:
        wall = max(1e-9, time.perf_counter() - self.t0)
        return {"data_wait_frac": min(1.0, self.wait / wall), "steps": self.steps, "wall_s": round(wall, 2)}

    def diagnosis(self) -> Diagnosis:
        return diagnose(self.measured())
