"""Decode-only throughput of every JPEG backend: img/s of 224 px training batches delivered to the device.

    python benchmarks/decode.py --src IMAGE_FOLDER --jpeg JPEG_CACHE [--seconds 5] [--backends dali,nvjpeg,cpu]

No model runs: this is how fast each backend can feed one. DALI runs five
times on a GPU: with the hardware JPEG decoder off (hw_decoder_load=0), at
DALI's default share (0.65) and with every image sent to it (1.0), then with
Huffman decoding moved from CPU threads to the GPU, and with 4 CPU threads
instead of all (if that row is as fast, decoding is not CPU-bound). On a GPU
each row also reports GPM SM activity and the hardware JPEG engines' NVML
utilization, which says whether the hardware decoder was used at all. Writes
Markdown + JSON to benchmarks/results/.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch

from _common import drain, write

log = logging.getLogger("decode-bench")


def settings(backends: list[str], gpu: bool) -> list[tuple[str, dict]]:
    out = []
    for b in backends:
        if b == "dali" and gpu:
            out += [("dali mixed, hw decoder off", dict(backend="dali", hw_decoder_load=0.0)),
                    ("dali mixed, hw decoder 0.65", dict(backend="dali", hw_decoder_load=0.65)),
                    ("dali mixed, hw decoder 1.0", dict(backend="dali", hw_decoder_load=1.0)),
                    ("dali mixed, hw off, Huffman on GPU", dict(backend="dali", hw_decoder_load=0.0,
                                                                hybrid_huffman_threshold=0)),
                    ("dali mixed, hw off, 4 CPU threads", dict(backend="dali", hw_decoder_load=0.0, threads=4))]
            # pipelines taking batches in turn (DaliOptions.pipelines): decoding alone with 2 pipelines read
            # 39k img/s of files on the H200 where one read 25k (dali-limits-H200-2026-12-03.md)
            out += [(f"dali mixed, hw decoder {load}, {k} pipelines", dict(backend="dali", hw_decoder_load=load,
                                                                              pipelines=k))
                    for k in (2, 3) for load in (0.0, 0.65, 1.0)]
        elif b == "dali":
            out.append(("dali cpu", dict(backend="dali", device="cpu")))
        elif b == "nvjpeg" and gpu:
            out += [("nvjpeg, GPU only (torchvision)", dict(backend="nvjpeg", cpu_share=0.0)),
                    ("nvjpeg, default (CPU share picked: decode_pool.resolve_share)", dict(backend="nvjpeg")),
                    ("nvjpeg, NVJPG engines, 2 lanes", dict(backend="nvjpeg", cpu_share=0.0, hardware=True, lanes=2)),
                    ("nvjpeg, NVJPG engines, 2 lanes, CPU share 0.5 in the default processes",
                     dict(backend="nvjpeg", hardware=True, lanes=2, cpu_share=0.5))]
        elif b == "cpu":
            out.append(("cpu (DALI cpu or PIL threads)", dict(backend="cpu", device="cpu")))
    return out


def main() -> None:
    from fastdata._util import usable_cpus
    from fastdata.read.verbs import decode_loader
    from fastdata.cache.hwjpeg import hardware_jpeg_decoder
    from fastdata.monitor.nvml import GpuSampler

    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, help="image folder of JPEGs")
    ap.add_argument("--jpeg", default=None, help="JPEG-encoded fastdata cache of the same images")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--backends", default="dali,nvjpeg,cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", default="", help="comma list of substrings: run the rows naming one")
    ap.add_argument("--sources", default="files,JPEG cache", help="comma list of: files, JPEG cache")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    gpu = torch.cuda.is_available()
    rows = []
    only = [o for o in a.only.split(",") if o]
    for name, kw in settings(a.backends.split(","), gpu):
        if only and not any(o in name for o in only):
            continue
        for label, path in (("files", a.src), ("JPEG cache", a.jpeg)):
            if path is None or label not in a.sources.split(","):
                continue
            try:
                dl = decode_loader(path, a.batch_size, dtype="bfloat16", **{"threads": usable_cpus(), **kw})
                with GpuSampler() as sampler:
                    rate = drain(dl, a.seconds)
                use = sampler.summary()
                rows.append({"backend": name, "source": label, "img/s": rate,
                             "SM activity %": use.get("sm_util", float("nan")),
                             "JPEG engine %": use.get("jpeg_engine_util", float("nan")), "ran": dl.source})
                dl.close()
                del dl
            except Exception as e:  # noqa: BLE001 - a missing backend must not lose the other rows
                log.exception("%s on %s failed", name, label)
                rows.append({"backend": name, "source": label, "img/s": 0.0, "ran": f"FAILED: {e}"[:140]})
            log.info("%s", rows[-1])
    extra = (f" --only '{a.only}'" if a.only else "") + (f" --sources '{a.sources}'" if a.sources != "files,JPEG cache" else "")
    hw = hardware_jpeg_decoder() if gpu else {"available": False, "reason": "no GPU"}
    log.info("hardware JPEG decoder: %s", hw)
    hw_text = f"available, {hw.get('engines')} engines" if hw["available"] else f"not usable: {hw['reason']}"
    notes = (f"Hardware JPEG decoder (nvjpegCreateEx with the hardware backend, fastdata/cache/hwjpeg.py): "
             f"{hw_text}; NVIDIA_DRIVER_CAPABILITIES={hw.get('driver_capabilities')}. "
             f"Batch {a.batch_size}, RandomResizedCrop 224 + flip + normalise to bf16 on the decoding device, "
             f"{a.seconds:.0f} s per row after 3 warm-up batches, {usable_cpus()} CPU threads. "
             f"Rerun: `python benchmarks/decode.py --src {Path(a.src).name} --jpeg ...{extra}`.")
    cols = ["backend", "source", "img/s", "SM activity %", "JPEG engine %", "ran"]
    write("decode", rows, cols, notes, Path(a.out) if a.out else None)


if __name__ == "__main__":
    main()
