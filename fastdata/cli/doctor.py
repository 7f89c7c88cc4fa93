"""`fastdata doctor` and `fastdata monitor`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from ..errors import FastdataError


def add_cli(sub, commands: dict) -> None:
    p = sub.add_parser("doctor", help="run training for a bounded time and name the bottleneck",
                       description="fastdata doctor --data CACHE [--model M]   or   fastdata doctor -- python train.py")
    p.add_argument("--data", default=None, help="cache or image folder to run the engine on (or give a command after --)")
    p.add_argument("--backend", default="auto", help="loader backend, as for fastdata train")
    p.add_argument("--model", default="resnet50", help="smallnet | resnet18 | resnet50 | module:function")
    p.add_argument("--batch-size", type=int, default=256, help="batch size")
    p.add_argument("--image-size", type=int, default=224, help="training crop size in pixels")
    p.add_argument("--precision", default="bf16", help="bf16 | fp16 | fp32 | tf32")
    p.add_argument("--compile", default="off", help="torch.compile mode (off | default | max-autotune | reduce-overhead)")
    p.add_argument("--seconds", type=float, default=20.0, help="how long to measure")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--timeline", default=None, metavar="PNG",
                   help="with a command: draw the profiled steps (data wait, H2D, kernels, idle) here (needs matplotlib)")
    p.add_argument("--warmup-steps", type=int, default=10, help="with a command: optimizer steps before measuring")
    p.add_argument("--timed-steps", type=int, default=30, help="with a command: steps in the timed window")
    p.add_argument("command", nargs="*", help="after --: your training command, run unmodified (a bootstrap "
                                              "times its loaders and optimizer steps and profiles a few steps)")
    commands["doctor"] = run_doctor_cli
    p = sub.add_parser("monitor", help="live GPU counters: duty cycle, SM activity (GPM), memory, power")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between lines")
    p.add_argument("--count", type=int, default=0, help="lines to print (0: until Ctrl-C)")
    commands["monitor"] = run_monitor


def _wrapped(a):
    from ..monitor.bootstrap import read_report, write_sitecustomize
    from ..monitor.doctor import diagnose
    from ..monitor.nvml import GpuSampler, SamplerConfig

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.json")
        write_sitecustomize(tmp)
        env = {**os.environ, "FASTDATA_DOCTOR_REPORT": path, "FASTDATA_DOCTOR_WARMUP": str(a.warmup_steps),
               "FASTDATA_DOCTOR_TIMED": str(a.timed_steps),
               "PYTHONPATH": os.pathsep.join([tmp] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
        if a.timeline:
            env["FASTDATA_DOCTOR_TIMELINE"] = os.path.abspath(a.timeline)
        try:
            with GpuSampler(SamplerConfig(interval_s=0.5)) as sampler:   # GPM needs samples >= 0.1 s apart
                rc = _run_until_report(subprocess.Popen(a.command, env=env, start_new_session=True), path)
        except OSError as e:
            raise FastdataError(f"cannot run `{' '.join(a.command)}`: {e.strerror or e}; give the training "
                                f"command after --, e.g. fastdata doctor -- python train.py") from e
        if not os.path.exists(path):
            raise FastdataError(f"`{' '.join(a.command)}` (exit {rc}) wrote no doctor report: it is not a Python "
                                f"process, or it exited before its first batch; run it as `fastdata doctor -- "
                                f"python train.py ...`")
        m = read_report(path)
    if not m.get("steps") and not m.get("batches"):
        if rc not in (0, None, -signal.SIGTERM):     # it failed before training: its own error says why
            raise FastdataError(f"`{' '.join(a.command)}` failed (exit {rc}) before its first batch; fix the error "
                                f"it printed above, check that it runs alone, then rerun fastdata doctor")
        raise FastdataError(f"`{' '.join(a.command)}` (exit {rc}) took no batch from a DataLoader and made no "
                            f"optimizer step, so there is nothing to diagnose; give the command that trains "
                            f"(its loop iterates a DataLoader or calls optimizer.step())")
    m.update(_window_gpu(sampler, m.pop("window_monotonic", None)))
    return diagnose(m)


def _run_until_report(proc: subprocess.Popen, report: str, grace: float = 30.0) -> int:
    """Wait for the command; once it has written its report, stop it: the doctor measures a bounded
    window, and used to wait for the whole training run. SIGTERM goes to its process group (DataLoader
    workers, torchrun's ranks) and lets a script save a checkpoint; SIGKILL follows after `grace` s.
    The command runs in its own session, so Ctrl-C here is passed on to it."""
    def signal_group(sig) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
    try:
        while proc.poll() is None:
            if os.path.exists(report):
                try:                      # a report written at exit: the command is ending by itself
                    return proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pass
                print("fastdata doctor: measured; stopping the command", file=sys.stderr, flush=True)
                signal_group(signal.SIGTERM)
                try:
                    return proc.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    signal_group(signal.SIGKILL)
                    return proc.wait()
            time.sleep(0.2)
        return proc.returncode
    except KeyboardInterrupt:
        signal_group(signal.SIGINT)
        proc.wait()
        raise


def _window_gpu(sampler, window) -> dict:
    """Duty cycle and GPM SM activity over the script's timed window: samples taken inside it (a GPM
    value covers the interval up to its sample)."""
    if not window:
        return {}
    t0, t1 = window
    rows = [r for r in sampler.samples if t0 + sampler.cfg.interval_s <= r["t"] <= t1]
    keys = ("duty_cycle", "sm_util", "sm_occupancy")
    return {k: round(sum(r[k] for r in rows) / len(rows), 1) for k in keys if rows and all(k in r for r in rows)}


def _engine_run(a):
    from ..engine.config import EngineConfig
    from ..monitor.doctor import run_doctor
    from .assemble import RunConfig, assemble

    cfg = EngineConfig(precision=a.precision, compile=a.compile, log_every=10**6)
    run = assemble(RunConfig(data=a.data, model=a.model, batch_size=a.batch_size, backend=a.backend,
                             image_size=a.image_size, engine=cfg))
    return run_doctor(run.engine, run.loader, a.seconds)


def run_doctor_cli(a) -> int:
    if a.command:
        diag = _wrapped(a)
    elif a.data:
        diag = _engine_run(a)
    else:
        raise FastdataError("doctor needs --data CACHE (runs the engine) or `-- python train.py` (your loop)")
    print(diag.text())
    if a.json:
        with open(a.json, "w") as f:
            json.dump(diag.to_json(), f, indent=1)
    return 0


def run_monitor(a) -> int:
    from ..monitor.nvml import GpuSampler

    s = GpuSampler()
    if not s.available:
        raise FastdataError(f"no GPU counters here: {s.reason}")
    cols = ["duty_cycle", "sm_util", "sm_occupancy", "tensor_util", "dram_bw_util", "mem_used_gib", "power_w"]
    print("  ".join(f"{c:>12}" for c in cols))
    n = 0
    with s:
        try:
            while a.count == 0 or n < a.count:
                time.sleep(a.interval)
                row = s.samples[-1] if s.samples else {}
                print("  ".join(f"{row.get(c, float('nan')):12.1f}" for c in cols), flush=True)
                n += 1
        except KeyboardInterrupt:
            pass
    return 0
