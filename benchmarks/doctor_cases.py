"""Four planted bottlenecks on the GPU machine; the doctor must name each one.

    python benchmarks/doctor_cases.py [--photos DIR] [--out DIR]

input-bound: a PIL DataLoader with 2 workers feeding ResNet-18; h2d-bound: huge float32
batches from pageable memory into a tiny net; launch-bound: batch 8 of 32 px into a tiny
net (graphs fix it); compute-bound: ResNet-50 bf16 on data already on the GPU.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from _common import write


class Repeat:
    def __init__(self, x, y, n=10**6):
        self.x, self.y, self.n = x, y, n

    def __len__(self):
        return self.n

    def __iter__(self):
        return ((self.x, self.y) for _ in range(self.n))


def cases(src: Path):
    from _datasets import PilFolder
    from torch.utils.data import DataLoader
    from fastdata.engine.models import SmallNet, resolve_model

    dev = "cuda"
    yield "input-bound", resolve_model("resnet18", 10), "bf16", DataLoader(PilFolder(src), 128, num_workers=2)
    big = torch.randn(64, 3, 512, 512)  # 200 MB per batch, pageable
    yield "h2d-bound", SmallNet(10, 8), "bf16", Repeat(big, torch.randint(0, 10, (64,)))
    yield "launch-bound", SmallNet(10, 8), "fp32", Repeat(torch.randn(8, 3, 32, 32, device=dev),
                                                         torch.randint(0, 10, (8,), device=dev))
    yield "compute-bound", resolve_model("resnet50", 10), "bf16", Repeat(
        torch.randn(256, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last),
        torch.randint(0, 10, (256,), device=dev))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--photos", default=None)
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from fastdata.engine.config import EngineConfig
    from fastdata.engine.engine import Engine
    from fastdata.monitor.doctor import run_doctor
    from fastdata.sample import make_image_folder

    src = make_image_folder(Path(tempfile.mkdtemp()) / "src", 200, photos_dir=a.photos)
    rows, reports = [], {}
    for planted, model, precision, loader in cases(src):
        eng = Engine(model, EngineConfig(precision=precision, log_every=10**6))
        diag = run_doctor(eng, loader, a.seconds)
        reports[planted] = diag.to_json()
        print(f"--- planted {planted}\n{diag.text()}\n", flush=True)
        m = diag.measured
        rows.append({"planted": planted, "verdict": diag.verdict, "right": diag.verdict == planted,
                     "data wait": f"{m['data_wait_frac']:.0%}",
                     "gpu busy": f"{m['gpu_busy']:.0%}" if m.get("gpu_busy") is not None else "",
                     "h2d": f"{m['h2d']:.0%}" if m.get("h2d") is not None else "",
                     "duty cycle %": m.get("duty_cycle", ""), "SM activity %": m.get("sm_util", ""),
                     "first fix": diag.fixes[0][0][:60] if diag.fixes else ""})
    out = write("doctor", rows, ["planted", "verdict", "right", "data wait", "gpu busy", "h2d", "duty cycle %",
                                 "SM activity %", "first fix"], "Full reports: doctor-*.json next to this file.",
                Path(a.out) if a.out else None)
    out.with_name(out.stem + "-reports.json").write_text(json.dumps(reports, indent=1, default=str))


if __name__ == "__main__":
    main()
