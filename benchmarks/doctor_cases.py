"""Five planted bottlenecks in unmodified user scripts (benchmarks/doctor_cases/*.py); the doctor must
name each one, never suggest what the script already does, and cost at most 3% of its img/s.

    python benchmarks/doctor_cases.py [--photos DIR] [--seconds 20] [--cases input_bound,...]

Per case, in one run: the script alone (it prints its own steps/s after 20 steps), then the same
script under `fastdata doctor -- python CASE.py` (report JSON and timeline PNG next to the table).
The doctor's overhead is the steps/s it measured in its timed window against the script alone.
GPU machine only.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import RESULTS, ROOT, tag, write

CASES = {"input_bound": "input-bound", "h2d_bound": "h2d-bound", "launch_bound": "launch-bound",
         "sm_underfilled": "SM-underfilled", "compute_bound": "compute-bound"}
ALREADY = {"autocast": "AMP bf16", "compile": "torch.compile", "cuda_graph": "CUDA graph", "pinned": "pin host"}


def _rate(text: str, what: str) -> float | None:
    found = re.findall(rf"{what} ([0-9.]+)", text)
    return float(found[-1]) if found else None


def _run(cmd: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT / "benchmarks" / "doctor_cases")


def _suggests_existing(report: dict) -> list[str]:
    """Fixes that name what the script already does (must be none)."""
    f = report["measured"].get("features", {})
    pinned = any(x.get("pin_memory") for x in report["measured"].get("loaders", []))
    used = {"autocast": f.get("autocast") in ("bfloat16", "float16"), "compile": f.get("compile"),
            "cuda_graph": f.get("cuda_graph"), "pinned": pinned}
    return [what for what, _ in report["fixes"] for k, word in ALREADY.items() if used[k] and word in what]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--photos", default=None)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from fastdata.sample import make_image_folder

    out = Path(a.out) if a.out else RESULTS
    out.mkdir(parents=True, exist_ok=True)
    src = make_image_folder(Path(tempfile.mkdtemp()) / "src", 200, photos_dir=a.photos)
    env = {**os.environ, "CASE_SECONDS": str(a.seconds), "PYTHONPATH": str(ROOT)}
    rows, reports = [], {}
    for case in a.cases.split(","):
        args = [str(src)] if case == "input_bound" else []
        alone = _run([sys.executable, f"{case}.py", *args], env)
        js, png = out / f"doctor-{case}-{tag()}.json", out / f"doctor-{case}-{tag()}.png"
        doc = _run([sys.executable, "-m", "fastdata.cli", "doctor", "--json", str(js), "--timeline", str(png),
                    "--warmup-steps", "5", "--timed-steps", "20", "--", sys.executable, f"{case}.py", *args], env)
        if doc.returncode != 0 or not js.exists():
            rows.append({"planted": CASES[case], "verdict": f"FAILED: {doc.stderr.strip()[-200:]}"})
            continue
        report = json.loads(js.read_text())
        reports[case] = report
        m = report["measured"]
        # overhead: the steps/s the doctor measured in its timed window against the script's own, alone
        base, under = _rate(alone.stderr, "steps/s"), m.get("steps_per_s")
        rows.append({"planted": CASES[case], "verdict": report["verdict"], "right": report["verdict"] == CASES[case],
                     "data wait": f"{m.get('data_wait_frac', 0):.0%}", "gpu busy": m.get("gpu_busy"),
                     "h2d": m.get("h2d"), "duty %": m.get("duty_cycle"), "SM %": m.get("sm_util"),
                     "uses": ", ".join(f"{k}={v}" for k, v in m.get("features", {}).items()),
                     "suggests what it has": len(_suggests_existing(report)),
                     "steps/s alone": base, "steps/s in the doctor's window": under,
                     "overhead": f"{1 - under / base:+.1%}" if base and under else "",
                     "first fix": report["fixes"][0][0][:50] if report["fixes"] else ""})
        print(rows[-1], flush=True)
    right = sum(1 for r in rows if r.get("right"))
    notes = (f"{right}/{len(rows)} planted cases named right, each an unmodified script run as "
             f"`fastdata doctor -- python benchmarks/doctor_cases/CASE.py`; reports and timelines: doctor-CASE-*.json/png."
             f"\n\nRerun: `python benchmarks/doctor_cases.py --seconds {a.seconds}`")
    write("doctor-cases", rows, ["planted", "verdict", "right", "data wait", "gpu busy", "h2d", "duty %", "SM %",
                                 "uses", "suggests what it has", "steps/s alone", "steps/s in the doctor's window",
                                 "overhead",
                                 "first fix"], notes, out)


if __name__ == "__main__":
    main()
