"""Cost of resumable DALI crops: decode_loader(backend="dali") with crop="plan" against crop="dali".

    python benchmarks/dali_crop.py [--per-class 40] [--seconds 6] [--device cpu|auto]

crop="plan" draws each sample's crop window and flip on the host from (seed, epoch, batch) and the
image's header size, and feeds them to the graph (fastdata/read/backends/dali_crop.py), so a resumed
run decodes the same pixels; crop="dali" uses DALI's own random crop operator. Rows alternate (plan,
dali, plan, dali) in one run.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import drain, write


def main() -> None:
    import fastdata
    from fastdata.sample import make_image_folder

    ap = argparse.ArgumentParser()
    ap.add_argument("--per-class", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    src = Path(tempfile.mkdtemp(prefix="fastdata-dali-crop-")) / "src"
    make_image_folder(src, per_class=a.per_class)
    rows = []
    for crop in ("plan", "dali", "plan", "dali"):
        dl = fastdata.decode_loader(src, a.batch_size, backend="dali", device=a.device, crop=crop)
        rows.append({"crop": crop, "img/s": drain(dl, a.seconds)})
    best = {c: max(r["img/s"] for r in rows if r["crop"] == c) for c in ("plan", "dali")}
    notes = (f"{a.per_class * 10} JPEGs (~500x375), batch {a.batch_size}, device {a.device}. "
             f"Best of two: plan {best['plan']:,.0f} img/s, dali {best['dali']:,.0f} "
             f"(plan/dali = {best['plan'] / best['dali']:.2f}).\n\nRerun: `python benchmarks/dali_crop.py "
             f"--per-class {a.per_class} --seconds {a.seconds} --device {a.device}`")
    write("dali-crop", rows, ["crop", "img/s"], notes)


if __name__ == "__main__":
    main()
