"""The seed's optimisation path, measured end to end: ResNet-50 from JPEG files to a GPU-bound step.

    python benchmarks/pipeline.py [--per-class 2000] [--seconds 10] [--photos DIR] [--out DIR]

Each row adds one step and reports img/s, utilization.gpu (duty cycle), GPM
SM activity, data-wait fraction and speed-up over row 1. The last row is the
ceiling: the same engine on synthetic data already on the GPU. Goals
(issue 7): best real-data row >= 97% of the ceiling and >= 9x row 1.
Writes Markdown + JSON + a PNG bar chart to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from _common import Synthetic, drain, write

log = logging.getLogger("pipeline")
COLS = ["row", "img/s", "speed-up", "vs ceiling", "duty cycle %", "SM activity %", "data wait", "note"]


def _row(name: str, report: dict, note: str = "") -> dict:
    gpu = report.get("gpu", {})
    return {"row": name, "img/s": report["img_per_s"], "duty cycle %": gpu.get("duty_cycle", float("nan")),
            "SM activity %": gpu.get("sm_util", float("nan")), "data wait": f"{report['data_wait_frac']:.0%}",
            "note": note, "loss": report["loss"], "cuda_graph": report["cuda_graph"],
            "JPEG engine %": gpu.get("jpeg_engine_util", float("nan"))}   # JSON only: did a HW decoder run


def _data(a, work: Path):
    from fastdata.cache.build import BuildConfig, build_cache
    from fastdata.sample import make_image_folder

    src = work / "src"
    t0 = time.perf_counter()
    if not src.exists():            # --work reuses a folder made by an earlier run
        make_image_folder(src, a.per_class, photos_dir=a.photos)
    log.info("made %s in %.0f s", src, time.perf_counter() - t0)
    raw = build_cache(BuildConfig(src=str(src), dest=str(work / "raw256"), size=256, progress=False))
    jpg = build_cache(BuildConfig(src=str(src), dest=str(work / "jpeg256"), encode="jpeg", size=256, progress=False))
    log.info("raw cache: %s", raw.summary())
    log.info("jpeg cache: %s", jpg.summary())
    return src, work / "raw256", work / "jpeg256", {"raw_build": raw.summary(), "jpeg_build": jpg.summary()}


class Rows:
    """Collects rows; a row that fails is recorded with its error and the run goes on.

    `only` (from --rows) keeps the rows whose first word is listed: 1,2,3,4,5,6a,6b,7,7g,7b,8,8b,ceiling,synthetic.
    """

    def __init__(self, save, only: str | None = None) -> None:
        self.rows, self.save = [], save
        self.only = None if only is None else set(only.split(","))

    def wants(self, name: str) -> bool:
        return self.only is None or name.split()[0].rstrip(":") in self.only

    def add(self, name: str, fn, note: str = "") -> None:
        if not self.wants(name):
            return
        t0 = time.perf_counter()
        try:
            report = fn()
            self.rows.append(_row(name, report, note() if callable(note) else note))
        except Exception as e:  # noqa: BLE001 - a benchmark row failing must not lose the others
            log.exception("row %s failed", name)
            self.rows.append({"row": name, "img/s": 0.0, "data wait": "", "note": f"FAILED: {e}"[:160]})
        log.info("%s: %.0f img/s (%.0f s)", name, self.rows[-1]["img/s"], time.perf_counter() - t0)
        self.save(self.rows)


class Engines:
    """The row engines, each built on first use (a compiled one costs its compile time only if needed)."""

    def __init__(self, a) -> None:
        from fastdata.engine.config import EngineConfig

        self.a, self.made = a, {}
        self.cfgs = {"fp32": EngineConfig(precision="fp32", channels_last=False, log_every=1000),
                     "bf16": EngineConfig(precision="bf16", log_every=1000),
                     "compiled": EngineConfig(precision="bf16", compile=a.compile, log_every=1000),
                     "graphed": EngineConfig(precision="bf16", compile=a.compile, cuda_graph=True, log_every=1000)}

    def __call__(self, key: str, cfg=None):
        from fastdata.engine.engine import Engine
        from fastdata.engine.models import resolve_model

        if key not in self.made:
            self.made[key] = Engine(resolve_model(self.a.model, 10), cfg or self.cfgs[key])
        return self.made[key]


def _pil_rows(a, rows: Rows, eng: Engines, src: Path, info: dict, fit: dict) -> None:
    """Rows 1-5: the plain PIL ImageFolder recipe, then each usual fix on top of it."""
    import fastdata
    from _datasets import PilFolder
    from torch.utils.data import DataLoader
    from fastdata.engine.batch_size import BatchSearchConfig, find_batch_size

    bs, dev = a.batch_size, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows.add("1 PIL DataLoader, 4 workers, fp32", lambda: eng("fp32").fit(DataLoader(
        PilFolder(src), bs, shuffle=True, num_workers=4, pin_memory=True, persistent_workers=True,
        drop_last=True), **fit))
    if not any(rows.wants(k) for k in "2345"):
        return
    tuned = fastdata.dataloader(PilFolder(src), bs, autotune_seconds=0.8, drop_last=True)
    rows.add("2 + tuned DataLoader (autotune)", lambda: eng("fp32").fit(tuned, **fit),
             f"workers={tuned.num_workers} prefetch={tuned.prefetch_factor}")
    rows.add("3 + AMP bf16, channels_last", lambda: eng("bf16").fit(tuned, **fit))
    rows.add("4 + torch.compile", lambda: eng("compiled").fit(tuned, **fit))
    if not rows.wants("5"):
        return
    best, curve = find_batch_size(lambda b: eng("bf16").step.full(
        torch.randn(b, 3, 224, 224, device=dev).contiguous(memory_format=torch.channels_last),
        torch.randint(0, 10, (b,), device=dev)), dev, BatchSearchConfig(start=bs // 2, max_batch=bs * 4, steps=4))
    info["batch_curve"] = curve
    accum = max(1, best // bs)
    e5 = eng("accum", replace(eng.cfgs["compiled"], accum_steps=accum))  # its own compiled model
    rows.add(f"5 + batch search (best {best}): accumulate {accum} x {bs}", lambda: e5.fit(tuned, **fit))


def _dali_options(a) -> dict:
    """--dali-prefetch / --huffman-threshold / --hw-decoder-load for the DALI rows; nothing for others."""
    from fastdata.read.verbs import choose_backend

    if choose_backend(a.backend) != "dali" or not torch.cuda.is_available():
        return {}
    return {"prefetch": a.dali_prefetch, "hybrid_huffman_threshold": a.huffman_threshold,
            "hw_decoder_load": a.hw_decoder_load, "file_reader": a.file_reader, "pipelines": a.dali_pipelines}


def run(a, save) -> tuple[list[dict], dict]:
    import fastdata
    from fastdata.read.verbs import decode_loader
    from fastdata.read.augment import AugmentConfig

    work = Path(a.work or tempfile.mkdtemp(prefix="fastdata-pipeline-"))
    src, raw, jpeg, info = _data(a, work)
    bs, dev = a.batch_size, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    fit = dict(time_limit=a.seconds, warmup_steps=8, epochs=100)
    rows, eng = Rows(lambda r: save(r, info), a.rows), Engines(a)
    _pil_rows(a, rows, eng, src, info, fit)   # its persistent workers end here: they would compete below
    raw_dl = fastdata.loader(raw, bs, device=str(dev), augment=AugmentConfig(size=224, dtype="bfloat16"), threads=8,
                             drop_last=True)
    rows.add("6a fastdata raw cache + GPU loader", lambda: eng("compiled").fit(raw_dl, **fit))
    decoders = {}
    for path, name, engine in ((jpeg, "6b fastdata JPEG cache + GPU decode", "compiled"),
                               (src, "7 GPU decode from the JPEG files", "compiled"),
                               (src, "7g GPU decode from the JPEG files + CUDA graph", "graphed")):
        if rows.wants(name):
            dl = decoders.get(path) or decode_loader(path, bs, backend=a.backend, dtype="bfloat16", threads=12,
                                                     drop_last=True, **_dali_options(a))
            decoders[path] = dl
            rows.add(name, lambda: eng(engine).fit(dl, **fit), dl.source)
    if rows.wants("7b") and dev.type == "cuda" and a.backend in ("auto", "dali"):   # the fallback beside DALI
        dl7b = decode_loader(src, bs, backend="nvjpeg", dtype="bfloat16", threads=12, drop_last=True)
        rows.add("7b nvJPEG fallback from the JPEG files", lambda: eng("compiled").fit(dl7b, **fit), dl7b.source)
    rows.add("8 raw cache + GPU loader + CUDA graph", lambda: eng("graphed").fit(raw_dl, **fit))
    if rows.wants("8b"):   # the augmentation fused into one compiled kernel (benchmarks/augment.py)
        fused_dl = fastdata.loader(raw, bs, device=str(dev), threads=8, drop_last=True,
                                   augment=AugmentConfig(size=224, dtype="bfloat16", fused=True))
        rows.add("8b + fused GPU augment", lambda: eng("graphed").fit(fused_dl, **fit))
    rows.add("ceiling: synthetic on GPU, compile + graph", lambda: eng("graphed").fit(Synthetic(bs, 224, dev), **fit))
    rows.add("ceiling: synthetic on GPU, compile", lambda: eng("compiled").fit(Synthetic(bs, 224, dev), **fit))
    rows.add("synthetic on GPU, eager bf16", lambda: eng("bf16").fit(Synthetic(bs, 224, dev), **fit))
    rows.add("synthetic on GPU, eager fp32", lambda: eng("fp32").fit(Synthetic(bs, 224, dev), **fit))
    if dev.type == "cuda" and a.loader_seconds > 0:
        info["loader_only"] = {"raw cache + GPU RRC 224 bf16": drain(raw_dl, a.loader_seconds),
                               **{dl.source: drain(dl, a.loader_seconds) for dl in decoders.values()}}
    return rows.rows, info


def chart(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(10, 5))
    names = [r["row"] for r in rows]
    ax.barh(names[::-1], [r["img/s"] for r in rows][::-1], color="#4477aa")
    ax.set_xlabel("img/s (ResNet-50, one H200)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--backend", default="auto", help="GPU decode backend for rows 6b/7: auto|dali|nvjpeg")
    ap.add_argument("--photos", default=None)
    ap.add_argument("--dali-prefetch", type=int, default=2, help="batches DALI decodes ahead (rows 6b/7)")
    ap.add_argument("--huffman-threshold", type=int, default=1_000_000,
                    help="DALI: images with fewer pixels get CPU Huffman decoding (0: all on the GPU)")
    ap.add_argument("--hw-decoder-load", type=float, default=1.0,
                    help="DALI: share of images sent to the hardware JPEG decoder (rows 6b/7)")
    ap.add_argument("--dali-pipelines", type=int, default=1, help="DALI pipelines taking batches in turn")
    ap.add_argument("--file-reader", default="native", choices=["native", "feed"],
                    help="DALI rows 7/7g: DALI's C++ file reader or fastdata's Python feed")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--compile", default="default")
    ap.add_argument("--rows", default=None, help="only these rows: 1,2,3,4,5,6a,6b,7,7g,7b,8,8b,ceiling,synthetic")
    ap.add_argument("--loader-seconds", type=float, default=4.0, help="loader-alone rates (0: skip)")
    ap.add_argument("--chart", default=None, help="only redraw the PNG from a results JSON")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if a.chart:
        import json

        chart(json.loads(Path(a.chart).read_text())["rows"], Path(a.chart).with_suffix(".png"))
        return
    out = Path(a.out) if a.out else None
    rows, info = run(a, lambda r, i: report(a, r, i, out))
    md = report(a, rows, info, out)
    chart(rows, md.with_suffix(".png"))


def report(a, rows: list[dict], info: dict, out: Path | None) -> Path:
    rows = [dict(r) for r in rows]
    base = rows[0]["img/s"] or 1.0
    ceiling = max([r["img/s"] for r in rows if r["row"].startswith("ceiling")] or [0.0])
    for r in rows:
        r["speed-up"] = f"{r['img/s'] / base:.1f}x"
        r["vs ceiling"] = f"{r['img/s'] / ceiling:.1%}" if ceiling else "(no ceiling yet)"
    best = max((r for r in rows if r["row"][0].isdigit()), key=lambda r: r["img/s"])
    notes = (f"{a.per_class * 10} JPEGs (~500x375, q90, from skimage/sklearn photos), {a.model} "
             f"batch {a.batch_size} (every loader drops the last partial batch, as training recipes do), "
             f"{a.seconds:.0f} s timed per row after 8 warm-up steps. "
             f"Best real-data row: {best['row']} at {best['img/s']:.0f} img/s = "
             + (f"{best['img/s'] / ceiling:.1%} of the ceiling and " if ceiling else "")
             + f"{best['img/s'] / base:.1f}x row 1.\n\n"
             f"Builds: {info['raw_build']}; {info['jpeg_build']}.\nBatch-size curve: "
             + ", ".join(f"{c['batch_size']}: {c['img_per_s']:.0f}" for c in info.get("batch_curve", []))
             + "\n\nLoader alone, img/s to the GPU: "
             + ", ".join(f"{k}: {v:,.0f}" for k, v in info.get("loader_only", {}).items()))
    return write("pipeline", rows, COLS, notes, out)


if __name__ == "__main__":
    main()
