"""Model zoo: does fastdata keep each model as fast as a batch already on the GPU?

    python benchmarks/models.py --models resnet18,resnet50 [--per-class 1000] [--seconds 6] [--out DIR]
    python benchmarks/models.py --merge benchmarks/results/models-*.json     (one table + chart)

Per model (timm, 100 classes, batch 256, bf16 autocast, channels_last, torch.compile), all in one
process so the ratios compare like with like:
- plain loop (what a user writes: forward, backward, SGD step) on: a synthetic bf16 batch already on
  the GPU (the ceiling), fastdata.loader from a 256 px raw cache (RandomResizedCrop 224 + flip +
  normalise on the GPU), and the best torch DataLoader (PIL decode from the JPEG files, one worker per
  core, pinned, persistent);
- fastdata.Engine, compile and compile + CUDA graph, on the synthetic batch and on fastdata.loader;
- with --jpeg-backends nvjpeg,dali, the plain loop also reads a 256 px JPEG cache (the compact
  cache of datasets bigger than RAM), decoded on the GPU by each backend.
Ratios are to the synthetic row of the same loop. One model at a time fits a 10-minute GPU call.
--profile adds a torch.profiler table of the Engine + loader steps (host-side CUDA calls, syncs).
"""
from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from _common import machine, tag, write

log = logging.getLogger("models")
ZOO = ("resnet18", "resnet50", "mobilenetv3_large_100", "vit_small_patch16_224", "efficientnet_b0")
COLS = ["model", "loop", "data", "img/s", "vs synthetic"]


def make_model(name: str) -> torch.nn.Module:
    try:
        import timm

        return timm.create_model(name, num_classes=100)
    except ImportError:     # CPU box: the two ResNets of fastdata's own zoo
        from fastdata.engine.models import resolve_model

        return resolve_model(name, 100)


class SyntheticBatches:
    """One bf16 channels_last batch on the device, handed out forever: the loader can never be late."""

    def __init__(self, bs: int, device: torch.device, size: int = 224) -> None:
        self.x = torch.randn(bs, 3, size, size, device=device).to(torch.bfloat16).contiguous(
            memory_format=torch.channels_last)
        self.y = torch.randint(0, 100, (bs,), device=device)

    def __iter__(self):
        while True:
            yield self.x, self.y

    def __len__(self) -> int:
        return 10**9


def forever(dl):
    while True:
        yield from dl


def plain_loop(model, opt, data, seconds: float, warmup: int, device) -> float:
    """img/s of the loop a user writes; the host runs ahead freely (no syncs inside)."""
    it = iter(forever(data))

    def step():
        batch = next(it)
        x, y = batch[0].to(device, non_blocking=True), batch[1].to(device, non_blocking=True)
        x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return len(y)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize() if device.type == "cuda" else None
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        n += step()
    torch.cuda.synchronize() if device.type == "cuda" else None
    return n / (time.perf_counter() - t0)


def make_data(a, work: Path):
    from fastdata.cache.build import BuildConfig, build_cache
    from fastdata.sample import make_image_folder

    src = work / "src"
    if not src.exists():
        make_image_folder(src, a.per_class, photos_dir=None)
    raw = work / "raw256"
    if not raw.exists():
        build_cache(BuildConfig(src=str(src), dest=str(raw), size=256, progress=False))
    jpeg = work / "jpeg256"
    if getattr(a, "jpeg_backends", "") and not jpeg.exists():
        build_cache(BuildConfig(src=str(src), dest=str(jpeg), size=256, encode="jpeg", progress=False))
    return src, raw


def loaders(a, src: Path, raw: Path, device):
    import fastdata
    from _datasets import PilFolder
    from fastdata.read.augment import AugmentConfig
    from torch.utils.data import DataLoader

    aug = AugmentConfig(size=224, dtype="bfloat16", kernel=a.kernel)
    fd = fastdata.loader(raw, a.batch_size, device=str(device), augment=aug, threads=a.threads, drop_last=True)
    workers = a.workers or len(__import__("os").sched_getaffinity(0))
    pil = DataLoader(PilFolder(src), a.batch_size, shuffle=True, num_workers=workers, pin_memory=True,
                     persistent_workers=True, prefetch_factor=4, drop_last=True) if a.dataloader else None
    data = {"synthetic": SyntheticBatches(a.batch_size, device), "fastdata.loader": fd,
            f"PIL DataLoader ({workers} workers)": pil}
    for backend in filter(None, a.jpeg_backends.split(",")):   # the compact cache, decoded on the GPU
        data[f"fastdata.loader, JPEG cache, {backend}"] = fastdata.loader(
            raw.with_name("jpeg256"), a.batch_size, backend=backend, device=str(device), augment=aug,
            threads=a.jpeg_threads, drop_last=True)
    return data


def plain_rows(a, name, data: dict, device) -> list[dict]:
    """Rows of the plain loop. With --rounds N every data source runs N times, the sources alternating,
    and a row reports the median img/s and each round's ratio to that round's synthetic run (paired:
    a launch-bound model's loop varies by several percent from one run to the next)."""
    model = make_model(name).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    compiled = torch.compile(model)
    rates: dict[str, list[float]] = {k: [] for k, dl in data.items() if dl is not None}
    for r in range(a.rounds):
        for key in rates:
            rates[key].append(plain_loop(compiled, opt, data[key], a.seconds, a.warmup if r == 0 else 3, device))
            log.info("%s plain %s round %d: %.0f img/s", name, key, r, rates[key][-1])
    rows = []
    for key, got in rates.items():
        row = {"model": name, "loop": "plain, compile", "data": key, "img/s": float(np.median(got))}
        if a.rounds > 1:
            row["per-round ratio"] = " ".join(f"{v / s:.1%}" for v, s in zip(got, rates["synthetic"]))
        rows.append(row)
    return rows


def engine_rows(a, name, data: dict, device) -> list[dict]:
    from fastdata.engine.config import EngineConfig
    from fastdata.engine.engine import Engine

    rows = []
    for graph in {"both": (False, True), "graph": (True,), "compile": (False,)}[a.engine_modes]:
        torch.manual_seed(0)
        eng = Engine(make_model(name), EngineConfig(precision="bf16", compile="default", cuda_graph=graph,
                                                    log_every=10**6))
        loop = "Engine, compile + graph" if graph else "Engine, compile"
        for key in ("synthetic", "fastdata.loader"):
            report = eng.fit(data[key], time_limit=a.seconds, warmup_steps=a.warmup, epochs=10**6)
            rows.append({"model": name, "loop": loop, "data": key, "img/s": report["img_per_s"],
                         "data wait": report["data_wait_frac"], "cuda_graph": report["cuda_graph"]})
            log.info("%s %s %s: %.0f img/s (graph %s)", name, loop, key, report["img_per_s"], report["cuda_graph"])
        if a.profile:
            rows[-1]["profile"] = profile_engine(eng, data["fastdata.loader"])
        del eng
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return rows


def profile_engine(eng, dl) -> str:
    """Ten Engine steps on the loader under torch.profiler: where the host spends its time."""
    from torch.profiler import ProfilerActivity, profile

    eng.fit(dl, steps=eng.global_step + 3, epochs=10**6)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        eng.fit(dl, steps=eng.global_step + 10, epochs=10**6)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    print(table)
    return table


def with_ratios(rows: list[dict]) -> list[dict]:
    ceiling = {(r["model"], r["loop"]): r["img/s"] for r in rows if r["data"] == "synthetic"}
    for r in rows:
        base = ceiling.get((r["model"], r["loop"]))
        r["vs synthetic"] = f"{r['img/s'] / base:.1%}" if base else ""
    return rows


def chart(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    real = [r for r in rows if r["data"] != "synthetic" and r.get("vs synthetic")]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(real) + 1.5))
    labels = [f"{r['model']} | {r['loop']} | {r['data']}" for r in real][::-1]
    ax.barh(labels, [float(r["vs synthetic"].rstrip("%")) for r in real][::-1], color="#4477aa")
    ax.axvline(100, color="k", lw=0.8)
    ax.set_xlabel("% of the same loop on a synthetic batch (one H200)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18")
    ap.add_argument("--per-class", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=1, help="plain loop: alternate the data sources this many "
                    "times; rows report the median and each round's paired ratio")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--workers", type=int, default=0, help="PIL DataLoader workers (0: one per core)")
    ap.add_argument("--kernel", default="auto", help="fastdata.loader augmentation kernel")
    ap.add_argument("--jpeg-backends", default="", help="also feed the plain loop from a 256 px JPEG cache "
                    "through these loader backends (nvjpeg,dali)")
    ap.add_argument("--jpeg-threads", type=int, default=8, help="reader threads of the JPEG-cache loaders")
    ap.add_argument("--no-dataloader", dest="dataloader", action="store_false")
    ap.add_argument("--no-engine", dest="engine", action="store_false")
    ap.add_argument("--engine-modes", default="both", choices=["both", "graph", "compile"],
                    help="Engine rows: compile, compile + CUDA graph, or both")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--merge", nargs="*", default=None, help="result JSONs to merge into one table + chart")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    out = Path(a.out) if a.out else None
    if a.merge is not None:
        rows = [r for p in a.merge for r in json.loads(Path(p).read_text())["rows"]]
        md = write("models-zoo", with_ratios(rows), COLS, "Merged from " + ", ".join(a.merge), out)
        chart(rows, md.with_suffix(".png"))
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cudnn.benchmark = True
    src, raw = make_data(a, Path(a.work or tempfile.mkdtemp(prefix="fastdata-models-")))
    data = loaders(a, src, raw, device)
    rows: list[dict] = []
    for name in a.models.split(","):
        rows += plain_rows(a, name, data, device)
        if a.engine:
            rows += engine_rows(a, name, data, device)
        torch._dynamo.reset()
    notes = (f"{machine()['gpu']}: {a.per_class * 10} JPEGs -> 256 px raw cache; batch {a.batch_size}, bf16 "
             f"autocast, channels_last, torch.compile default; {a.seconds:.0f} s timed per row after "
             f"{a.warmup} warm-up steps; loader kernel {a.kernel}. Rerun: `python benchmarks/models.py "
             f"--models {a.models}" + (f" --rounds {a.rounds}" if a.rounds > 1 else "")
             + (f" --jpeg-backends {a.jpeg_backends}" if a.jpeg_backends else "") + "`.")
    md = write(f"models-{a.models.replace(',', '-')}", with_ratios(rows),
               COLS + ["data wait", "cuda_graph"] + (["per-round ratio"] if a.rounds > 1 else []),
               notes, out)
    chart(rows, md.with_suffix(".png"))
    print(tag())


if __name__ == "__main__":
    main()
