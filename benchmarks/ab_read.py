"""A/B: this tree's read pipeline against an older fastdata tree, in one run on one machine.

    git archive OLD_COMMIT fastdata | tar -x -C /tmp/old       # the old package beside this one
    python benchmarks/ab_read.py --old /tmp/old [--per-class 500] [--seconds 6] [--rounds 2]

Both trees run the same child script in turn (old, new, old, new, ... for --rounds), through the
public API they share (fastdata.loader, decode_loader, Engine), on the same caches:

    loader raw     fastdata.loader alone: raw cache -> GPU, RandomResizedCrop 224, bf16
    loader nvjpeg  decode_loader(backend=nvjpeg) alone, from the JPEG files
    6a             Engine (compile) fed by the raw-cache loader
    8b             Engine (compile + CUDA graph) fed by the raw-cache loader, compiled augmentation
    7              Engine (compile) fed by nvJPEG decode from the JPEG files
    ceiling        Engine (compile + CUDA graph) on a synthetic batch already on the GPU

and the table gives each row's img/s per tree and new/old, the mean over rounds. Markdown + JSON
go to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import data_args

HERE = Path(__file__).resolve().parent
ROWS = ("loader raw", "loader nvjpeg", "6a", "8b", "7", "ceiling")


def child(a) -> None:
    """Runs inside one tree (PYTHONPATH): every row, one JSON line on stdout."""
    import torch

    import fastdata
    from _common import Synthetic, drain
    from fastdata.engine.models import resolve_model

    dev, bs, out = torch.device("cuda"), a.batch_size, {}
    aug = fastdata.AugmentConfig(size=a.size, dtype="bfloat16")
    fused = fastdata.AugmentConfig(size=a.size, dtype="bfloat16", fused=True)
    raw = fastdata.loader(a.raw, bs, device="cuda", augment=aug, threads=8, drop_last=True)
    nvj = fastdata.decode_loader(a.src, bs, backend="nvjpeg", dtype="bfloat16", threads=12, drop_last=True)
    out["loader raw"] = drain(raw, a.seconds)
    out["loader nvjpeg"] = drain(nvj, a.seconds)
    if a.rows == "loader":
        print("AB " + json.dumps(out), flush=True)
        return
    fit = dict(time_limit=a.seconds, warmup_steps=8, epochs=100)

    def engine(graph: bool):
        cfg = fastdata.EngineConfig(precision="bf16", compile="default", cuda_graph=graph, log_every=1000)
        return fastdata.Engine(resolve_model("resnet50", 10), cfg)

    compiled, graphed = engine(False), engine(True)
    out["6a"] = compiled.fit(raw, **fit)["img_per_s"]
    out["7"] = compiled.fit(nvj, **fit)["img_per_s"]
    out["8b"] = graphed.fit(fastdata.loader(a.raw, bs, device="cuda", augment=fused, threads=8, drop_last=True),
                            **fit)["img_per_s"]
    out["ceiling"] = graphed.fit(Synthetic(bs, a.size, dev), **fit)["img_per_s"]
    print("AB " + json.dumps(out), flush=True)


def _data(a, work: Path) -> tuple[Path, Path]:
    from fastdata.cache.build import BuildConfig, build_cache
    from fastdata.sample import make_image_folder

    src = work / "src"
    if not src.exists():
        make_image_folder(src, a.per_class)
    build_cache(BuildConfig(src=str(src), dest=str(work / "raw256"), size=256, progress=False))
    return src, work / "raw256"


def _run_tree(tree: str, a, src: Path, raw: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{tree}:{HERE}"}
    cmd = [sys.executable, __file__, "--child", "--src", str(src), "--raw", str(raw), "--seconds", str(a.seconds),
           "--batch-size", str(a.batch_size), "--size", str(a.size), "--rows", a.rows]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.child_timeout)
    line = [x for x in r.stdout.splitlines() if x.startswith("AB ")]
    if not line:
        print(r.stdout[-2000:], r.stderr[-3000:], file=sys.stderr)
        return {}
    return json.loads(line[0][3:])


def main() -> None:
    ap = data_args(per_class=500, size=224, seconds=6.0)     # --size: the training crop
    ap.add_argument("--old", help="folder holding the old fastdata package")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--child-timeout", type=float, default=400)
    ap.add_argument("--rows", default="all", choices=("all", "loader"), help="loader: the loader-alone rows only")
    ap.add_argument("--work", default=None)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--src"), ap.add_argument("--raw")
    a = ap.parse_args()
    if a.child:
        return child(a)
    work = Path(a.work or tempfile.mkdtemp(prefix="fastdata-ab-"))
    t0 = time.perf_counter()
    src, raw = _data(a, work)
    print(f"data ready in {time.perf_counter() - t0:.0f} s", flush=True)
    runs = {"old": [], "new": []}
    for k in range(a.rounds):
        for name, tree in (("old", a.old), ("new", str(HERE.parent))):
            runs[name].append(_run_tree(tree, a, src, raw))
            print(name, k, runs[name][-1], flush=True)
    mean = {n: {r: sum(x.get(r, 0) for x in v) / max(1, len(v)) for r in ROWS} for n, v in runs.items()}
    lines = ["| row | old img/s | new img/s | new/old |", "|---|---|---|---|"]
    for r in ROWS:
        o, n = mean["old"][r], mean["new"][r]
        if not (o or n):
            continue
        lines.append(f"| {r} | {o:,.0f} | {n:,.0f} | {n / o:.3f} |" if o else f"| {r} | - | {n:,.0f} | - |")
    table = "\n".join(lines)
    print(table)
    import torch

    stamp = f"{torch.cuda.get_device_name(0).split()[-1]}-{time.strftime('%Y-%m-%d-%H%M')}"
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cmd = "python benchmarks/ab_read.py " + " ".join(sys.argv[1:])
    (out / f"ab-read-{stamp}.md").write_text(f"# Read pipeline A/B ({stamp})\n\n`{cmd}`\n\n{table}\n")
    (out / f"ab-read-{stamp}.json").write_text(json.dumps({"runs": runs, "mean": mean, "cmd": cmd}, indent=1))


if __name__ == "__main__":
    main()
