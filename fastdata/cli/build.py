"""CLI commands of the write side: build-cache, plan, verify, info, stage, merge."""
from __future__ import annotations

import argparse
import os

from ..errors import FastdataError
from ..stores.s3 import parse_options


def _slurm_part() -> tuple[int, int]:
    """--part slurm: this array task's slice, from the variables Slurm sets for `sbatch --array`."""
    env = os.environ
    try:
        task, count = int(env["SLURM_ARRAY_TASK_ID"]), int(env["SLURM_ARRAY_TASK_COUNT"])
        first = int(env.get("SLURM_ARRAY_TASK_MIN", 0))
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError("--part slurm: SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT are not "
                                         "set; run it inside `sbatch --array=0-N`, or give --part i/n") from None
    return task - first, count


def _part(text: str) -> tuple[int, int]:
    if text == "slurm":
        return _slurm_part()
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--part {text!r}: give i/n, e.g. 0/4 (0-based)") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"--part {text!r}: need 0 <= i < n")
    return i, n


def _storage_option(p) -> None:
    p.add_argument("--storage-options", default=None, metavar="JSON",
                   help="for s3:// paths: s3fs options as JSON, e.g. '{\"endpoint_url\": \"http://host:9000\"}' "
                        "(credentials otherwise come from the AWS_* environment); secrets are never recorded")


def _add_build(sub) -> None:
    p = sub.add_parser("build-cache", help="decode/resize SRC once into shards in DEST")
    p.add_argument("src", help="image folder (class sub-folders), file list (.csv/.txt: path,label), or any folder")
    p.add_argument("dest", help="cache folder to write (resumes if a build there was interrupted)")
    p.add_argument("--format", default="h5", choices=("h5", "pt"), help="shard container (default h5)")
    p.add_argument("--encode", default="raw", choices=("raw", "jpeg", "bytes"),
                   help="raw: decoded uint8 pixels (fastest reads); jpeg: re-encoded, ~10x smaller; "
                        "bytes: the input files verbatim")
    p.add_argument("--size", type=int, default=256, help="target pixels (see --resize; default 256)")
    p.add_argument("--resize", default="fixed", choices=("fixed", "short", "max", "none"),
                   help="fixed: short side to SIZE then centre SIZExSIZE crop; short/max keep aspect")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality for --encode jpeg (default 90)")
    p.add_argument("--shard-size", default="256MB", help="bytes per shard, e.g. 256MB or 1GiB")
    p.add_argument("--workers", type=int, default=None,
                   help="decode processes (default: usable CPUs); with --decoder nvjpeg, 3 in 8 of them use the "
                        "CPU codec (FASTDATA_BUILD_CPU_PROCESSES=K sets how many) and the rest decode on the GPU, "
                        "as many as its free memory holds (0: threads in this process)")
    p.add_argument("--on-error", default="quarantine", choices=("quarantine", "raise"),
                   help="an undecodable input is listed and left out (quarantine), or stops the build")
    p.add_argument("--part", type=_part, default=None,
                   help="build slice i/n of the inputs (job arrays); 'slurm' reads SLURM_ARRAY_TASK_ID/COUNT")
    p.add_argument("--executor", default="local",
                   help="local (process pool), dask (a LocalCluster) or dask://HOST:PORT (a running "
                        "scheduler whose workers see SRC and DEST at the same paths)")
    p.add_argument("--decoder", default="cpu", choices=("cpu", "nvjpeg"),
                   help="cpu: PIL in the worker processes; nvjpeg: this machine's GPU decodes the JPEGs "
                        "(torchvision), the CPU codec the rest; pixels differ slightly (README, Faster builds)")
    p.add_argument("--stage", default=None, help="after building, copy to this tmpfs folder (e.g. /dev/shm/x)")
    _storage_option(p)
    p.add_argument("--allow-empty-classes", action="store_true",
                   help="keep class folders without images as labels (refused by default, as ImageFolder does)")
    p.add_argument("--classes-from", default=None, metavar="CACHE",
                   help="number SRC's classes as this cache does (e.g. the training cache, when building a "
                        "validation set that lacks some classes); a class it does not know is an error")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--dry-run", action="store_true",
                   help="write nothing: estimate raw and JPEG cache sizes and build time from a sample of "
                        "the inputs, compare them with RAM and free disk, and recommend a setting")


def _cmd_plan(a) -> int:
    from ..cache.codecs import CodecConfig, check_codec
    from ..cache.plan import plan
    from ..cache.sources import discover, split_hint

    codec = CodecConfig(a.encode if a.encode != "bytes" else "raw", a.size, a.resize, a.quality)
    check_codec(codec)      # before discovery, which can take minutes on a large SRC
    options = parse_options(a.storage_options) or None
    source = discover(a.src, images_only=a.encode != "bytes", storage_options=options,
                      allow_empty_classes=a.allow_empty_classes)
    print(plan(source.items, codec, getattr(a, "dest", None), options).text())
    hint = split_hint(source, a.src)
    if hint:
        print(f"warning: {hint}")
    return 0


def _cmd_build(a) -> int:
    from ..cache.build import BuildConfig, build_cache

    if a.dry_run:
        return _cmd_plan(a)
    cfg = BuildConfig(src=a.src, dest=a.dest, format=a.format, encode=a.encode, size=a.size, resize=a.resize,
                      quality=a.quality, shard_size=a.shard_size, workers=a.workers, on_error=a.on_error,
                      part=a.part, progress=not a.no_progress, allow_empty_classes=a.allow_empty_classes,
                      executor=a.executor, storage_options=parse_options(a.storage_options) or None,
                      decoder=a.decoder, classes_from=a.classes_from)
    result = build_cache(cfg)
    print(result.summary())
    for q in result.manifest.quarantined[:20]:
        print(f"  quarantined {q['path']}: {q['reason']}")
    if len(result.manifest.quarantined) > 20:
        print(f"  ... `fastdata info {a.dest}` lists all {len(result.manifest.quarantined)}")
    if a.stage:
        from ..cache.stage import stage_cache

        print(f"read from: {stage_cache(a.dest, a.stage)}")
    return 0


def _cmd_verify(a) -> int:
    from ..cache.verify import verify_cache

    report = verify_cache(a.cache, parse_options(a.storage_options) or None)
    print(report.text())
    return 0 if report.ok else 1


def _cmd_info(a) -> int:
    from .._util import human_bytes, memory_budget, memory_total
    from ..cache.format import load_manifest

    m = load_manifest(a.cache, parse_options(a.storage_options) or None)
    total = sum(s.bytes for s in m.shards)
    print(f"{a.cache}: format v{m.format_version}, {m.kind} in {m.shard_format} shards")
    print(f"  samples {m.num_samples}, shards {len(m.shards)}, {human_bytes(total)}, "
          f"shape {tuple(m.sample_shape) if m.sample_shape else 'variable'}, classes {len(m.label_map)}")
    gpu = f" decoder={m.build['decoder']}" if "decoder" in m.build else ""   # nvjpeg: pixels differ from cpu
    print(f"  build: size={m.build.get('size')} resize={m.build.get('resize')} encode={m.build.get('encode')}{gpu}")
    names = sorted(m.label_map, key=m.label_map.get)
    print(f"  labels: {', '.join(f'{m.label_map[n]} {n}' for n in names[:12])}"
          f"{f', ... ({len(names) - 12} more in manifest.json label_map)' if len(names) > 12 else ''}")
    ram, budget = memory_total(), memory_budget()
    where = ("fits in half of the memory budget: read at memory speed" if total <= budget // 2 else
             "larger than half of the memory budget: fastdata.loader streams it from disk (memory='auto')")
    print(f"  size {human_bytes(total)} = {total / max(1, ram):.0%} of RAM ({human_bytes(ram)}); {where}")
    print(f"  quarantined {len(m.quarantined)}")
    for q in m.quarantined:
        print(f"    {q['path']}: {q['reason']}")
    return 0


def _cmd_stage(a) -> int:
    from ..cache.stage import stage_cache, unstage

    if a.remove and len(a.paths) == 1:
        left = unstage(a.paths[0])
        print(f"removed {a.paths[0]}" if not left else f"removed the staged copy in {a.paths[0]}; left the "
              f"{len(left)} file(s) fastdata did not put there: {', '.join(left[:5])}")
    elif not a.remove and len(a.paths) == 2:
        print(stage_cache(*a.paths))
    else:
        raise FastdataError("stage takes CACHE TARGET (copy) or --remove TARGET (delete a staged copy)")
    return 0


def _cmd_merge(a) -> int:
    from ..cache.merge import merge_caches

    m = merge_caches(a.out, a.parts)
    print(f"{a.out}: {m.num_samples} samples in {len(m.shards)} shards from {len(a.parts)} parts")
    return 0


def add_cli(sub, commands: dict) -> None:
    _add_build(sub)
    p = sub.add_parser("plan", help="estimate cache sizes and build time for SRC; recommend raw, jpeg or a size")
    p.add_argument("src", help="image folder, file list, tar, or s3:// prefix")
    p.add_argument("--size", type=int, default=256, help="target pixels (as for build-cache)")
    p.add_argument("--resize", default="fixed", choices=("fixed", "short", "max", "none"), help="as for build-cache")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality of the JPEG estimate")
    p.add_argument("--encode", default="raw", choices=("raw", "jpeg", "bytes"), help="as for build-cache")
    p.add_argument("--allow-empty-classes", action="store_true", help="as for build-cache")
    _storage_option(p)
    p = sub.add_parser("verify", help="check every shard checksum; name damaged shards and samples")
    p.add_argument("cache", help="cache folder or s3:// prefix")
    _storage_option(p)
    p = sub.add_parser("info", help="print the manifest summary")
    p.add_argument("cache", help="cache folder or s3:// prefix")
    _storage_option(p)
    p = sub.add_parser("stage", help="copy a cache to tmpfs: stage CACHE TARGET, or stage --remove TARGET")
    p.add_argument("paths", nargs="+", metavar="PATH", help="CACHE TARGET, or TARGET with --remove")
    p.add_argument("--remove", action="store_true", help="delete a staged copy (only one fastdata staged)")
    p = sub.add_parser("merge", help="join caches built with --part into OUT")
    p.add_argument("out", help="new or empty folder for the merged cache")
    p.add_argument("parts", nargs="+", help="the part caches 0..n-1 of one build, in any order")
    commands.update({"build-cache": _cmd_build, "plan": _cmd_plan, "verify": _cmd_verify, "info": _cmd_info,
                     "stage": _cmd_stage, "merge": _cmd_merge})
