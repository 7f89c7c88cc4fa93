#!/usr/bin/env bash
# Every GPU measurement of a session, in stages that each fit one 10-minute call on the lent GPU machine.
#
#   bash tools/gpu_session.sh STAGE [STAGE...]     stages: tests loader augment train data dali limits decode pipeline
#
# Results land in $OUT (the device tool fetches them) or benchmarks/results/. Data sets are generated
# once under $WORK (default /tmp/fastdata-gpu) and reused by later stages on the same machine.
# Photos: pass FASTDATA_PHOTOS=DIR (PNG files from `python tools/make_sample.py DIR --export-photos`)
# where scikit-image is not installed. DALI: `dali` joins .dali*/part-* (a split tar.xz of an
# unpacked DALI install, sent over several calls) into /tmp/dalisite and puts it on PYTHONPATH, then runs
# the DALI tests (DALI_TESTS=tests/gpu: only the GPU ones). tools/dali_parts.sh makes and joins the parts.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
WORK=${WORK:-/tmp/fastdata-gpu}
RES=${OUT:-benchmarks/results}
PY=${PY:-python3}
mkdir -p "$WORK" "$RES"
[ -d /tmp/dalisite/nvidia/dali ] && export PYTHONPATH="$PYTHONPATH:/tmp/dalisite"

stage_tests() {   # GPU tests; the DALI ones skip until stage dali has run
    $PY -m fastdata.cache.hwjpeg | tee "$RES/hwjpeg.json"; ls /dev/nvidia* | tr '\n' ' '; echo
    $PY -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tee "$RES/gpu-tests.txt" | tail -25
}
stage_loader() {
    $PY benchmarks/loader.py --per-class 1000 --seconds 5 --work "$WORK/loader" --out "$RES"
}
stage_augment() {
    $PY benchmarks/augment.py --out "$RES"
}
stage_train() {
    $PY benchmarks/train.py --model resnet50 --batch-size 256 --seconds 5 --classes 10 \
        --modes eager,compile,"compile + graph" \
        --out "$RES"
}
stage_data() {   # the pipeline's 20k JPEGs and both caches, made once
    $PY - "$WORK/pipe" <<'EOF'
import sys, time
from pathlib import Path
from fastdata.cache.build import BuildConfig, build_cache
from fastdata.sample import make_image_folder
work = Path(sys.argv[1]); t0 = time.time()
if not (work / "src").exists():
    make_image_folder(work / "src", 2000)
print(f"images: {time.time() - t0:.0f} s")
for name, kw in (("raw256", {}), ("jpeg256", {"encode": "jpeg"})):
    print(build_cache(BuildConfig(src=str(work / "src"), dest=str(work / name), size=256, progress=False, **kw)).summary())
EOF
}
stage_dali() {
    bash tools/dali_parts.sh join || return 1
    export PYTHONPATH="$PYTHONPATH:/tmp/dalisite"
    $PY -c "import nvidia.dali as d; print('DALI', d.__version__)" || return 1
    $PY -m pytest -q ${DALI_TESTS:-tests/test_dali.py tests/gpu} -k "dali or nvjpeg" -m "" -p no:cacheprovider 2>&1 \
        | tee "$RES/dali-tests.txt" | tail -15
}
stage_decode() {
    $PY benchmarks/decode.py --src "$WORK/pipe/src" --jpeg "$WORK/pipe/jpeg256" --seconds 4 --out "$RES"
}
stage_limits() {   # DALI's file decode taken apart (needs stage dali first)
    $PY benchmarks/dali_limits.py --src "$WORK/pipe/src" --seconds 3 --out "$RES"
}
stage_pipeline() {
    $PY benchmarks/pipeline.py --work "$WORK/pipe" --seconds 6 --out "$RES" ${PIPE_ROWS:+--rows $PIPE_ROWS} ${PIPE_ARGS:-} 2>&1 | tee "$RES/pipeline.log" \
        | grep -v "^\[rank\|Warning" | tail -60
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
for s in "$@"; do
    echo "=== stage $s ($(date +%T))"
    "stage_$s" || echo "=== stage $s FAILED"
done
echo "=== done ($(date +%T))"
