"""The engine's speed on synthetic data already on the GPU: eager / compile / compile + CUDA graph x precision.

    python benchmarks/train.py [--model resnet50] [--batch-size 256] [--seconds 8] [--precisions fp32,bf16]

Data never waits, so each row is the model's own ceiling under that engine
setting. Every row reports img/s, NVML duty cycle and GPM SM activity (the
true utilisation) over the timed window, after warm-up steps in which
compilation, cuDNN autotuning and graph capture happen. fp32 means true fp32
(TF32 off); tf32 is its own precision. Writes Markdown + JSON to
benchmarks/results/ (named after the GPU and the date).
"""
from __future__ import annotations

import argparse
import logging
import time

import torch

from _common import Synthetic, write

log = logging.getLogger("train-bench")
MODES = {"eager": dict(compile="off"), "eager + graph": dict(compile="off", cuda_graph=True),
         "compile": dict(compile="default"), "compile + graph": dict(compile="default", cuda_graph=True)}
COLS = ["precision", "mode", "img/s", "vs eager", "duty cycle %", "SM activity %", "tensor %", "graph",
        "warm-up s", "note"]


def one_row(a, precision: str, mode: str) -> dict:
    from fastdata.engine.config import EngineConfig
    from fastdata.engine.engine import Engine
    from fastdata.engine.models import resolve_model

    torch.manual_seed(0)
    eng = Engine(resolve_model(a.model, a.classes), EngineConfig(precision=precision, log_every=1000, **MODES[mode]))
    data = Synthetic(a.batch_size, a.image_size, eng.device)
    t0 = time.perf_counter()
    eng.fit(data, steps=a.warmup, warmup_steps=a.warmup)      # compile, autotune, capture
    warm = time.perf_counter() - t0
    rep = eng.fit(data, time_limit=a.seconds, warmup_steps=3, epochs=1)
    gpu = rep.get("gpu", {})
    return {"precision": precision, "mode": mode, "img/s": rep["img_per_s"],
            "duty cycle %": gpu.get("duty_cycle", float("nan")), "SM activity %": gpu.get("sm_util", float("nan")),
            "tensor %": gpu.get("tensor_util", float("nan")), "graph": rep["cuda_graph"], "warm-up s": warm,
            "loss": rep["loss"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    rows = []
    for precision in a.precisions.split(","):
        for mode in a.modes.split(","):
            try:
                rows.append(one_row(a, precision, mode))
            except Exception as e:  # noqa: BLE001 - one failing setting must not lose the others
                log.exception("%s %s failed", precision, mode)
                rows.append({"precision": precision, "mode": mode, "img/s": 0.0, "note": f"FAILED: {e}"[:160]})
            log.info("%s", rows[-1])
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
    for r in rows:
        base = next((x["img/s"] for x in rows if x["precision"] == r["precision"] and x["mode"] == "eager"), 0)
        r["vs eager"] = f"{r['img/s'] / base:.2f}x" if base else ""
    best = max(rows, key=lambda r: r["img/s"])
    notes = (f"{a.model}, batch {a.batch_size}, {a.image_size} px, synthetic batch already on the device; "
             f"{a.warmup} warm-up steps (compile/capture), then {a.seconds:.0f} s timed. "
             f"Fastest: {best['precision']} {best['mode']} at {best['img/s']:,.0f} img/s.\n\n"
             f"Rerun: `python benchmarks/train.py --model {a.model} --batch-size {a.batch_size}`.")
    write(f"train-{a.model}", rows, COLS, notes, None if a.out is None else __import__("pathlib").Path(a.out))


if __name__ == "__main__":
    main()
