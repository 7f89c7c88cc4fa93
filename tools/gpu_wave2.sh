#!/usr/bin/env bash
# Wave-2 GPU measurements, one device call per stage list; everything lands in one tarball in $OUT
# (the device tool brings back at most 8 files).
#   bash tools/gpu_wave2.sh tests doctor       (call 1)
#   bash tools/gpu_wave2.sh loader oor         (call 2)
#   bash tools/gpu_wave2.sh dali zoo decode    (DALI first: it puts the joined DALI on PYTHONPATH)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
RES=/tmp/wave2-results
mkdir -p "$RES"
PY=${PY:-python3}
stage_tests() {
    $PY -m pytest -q -m gpu tests/gpu -p no:cacheprovider 2>&1 | tee "$RES/gpu-tests-wave2.txt" | tail -20
}
stage_doctor() {
    $PY benchmarks/doctor_cases.py --seconds ${CASE_SECONDS:-15} --out "$RES" 2>&1 | grep -v "^USDT\|Warning" | tail -30
}
stage_loader() {
    $PY benchmarks/loader.py --per-class 1000 --seconds 5 --out "$RES" 2>&1 | tail -25
}
stage_oor() {   # no cgroup where the runtime has none: the loader is then given the budget explicitly
    $PY benchmarks/out_of_ram.py --images ${OOR_IMAGES:-40000} --memory ${OOR_MEMORY:-3GB} --batch-size 256 \
        --rows ${OOR_ROWS:-stream} --work /tmp/oor 2>&1 | tail -12
    cp benchmarks/results/out-of-ram-*H200* benchmarks/results/loader-*H200* "$RES"/ 2>/dev/null
}
stage_hwjpeg() {    # whether the NVJPG engines open here (hw_decode.py needs them), as JSON
    $PY -m fastdata.cache.hwjpeg | tee "$RES/hwjpeg-$(date +%F).json"
}
stage_augtests() {
    timeout ${TESTS_TIMEOUT:-300} $PY -m pytest -q -m gpu tests/gpu -p no:cacheprovider -k "${TESTS_K:-augment or fast_loader}" 2>&1 | tee "$RES/gpu-tests-augment.txt" | tail -15
}
stage_augment() {
    $PY benchmarks/augment.py --out "$RES" 2>&1 | tail -12
}
stage_zoo() {       # MODELS=resnet18,resnet50 ZOO_ARGS="--profile"
    timeout ${ZOO_TIMEOUT:-420} $PY benchmarks/models.py --models ${MODELS:-resnet18} --work /tmp/zoo --out "$RES" \
        ${ZOO_ARGS:-} 2>&1 | grep -v "Warning\|warn(" | tail -60
}
stage_probe() {     # PROBE_MODEL=resnet18
    timeout ${PROBE_TIMEOUT:-240} $PY benchmarks/host_probe.py --model ${PROBE_MODEL:-resnet18} --work /tmp/zoo \
        --out "$RES" ${PROBE_ARGS:-} 2>&1 | grep -v "Warning\|warn(" | tail -25
}
stage_pyspy() {    # PROBE_ARGS under py-spy (wheel carried in .pyspy): GIL holders' stacks, per thread
    $PY -m pip install -q --no-index --no-deps --target /tmp/pyspy .pyspy/*.whl || return 1
    timeout ${PROBE_TIMEOUT:-240} /tmp/pyspy/bin/py-spy record --gil --threads --nonblocking --format raw -r 200 \
        -o "$RES/pyspy-${PROBE_MODEL:-resnet18}.txt" -- $PY benchmarks/host_probe.py --model ${PROBE_MODEL:-resnet18} \
        --work /tmp/zoo --out "$RES" ${PROBE_ARGS:-} 2>&1 | grep -v "Warning\|warn(" | tail -15
    $PY tools/pyspy_summary.py "$RES/pyspy-${PROBE_MODEL:-resnet18}.txt" | head -60
}
stage_idle() {      # where each thread waits, running or not (py-spy --idle, launched as the parent: attaching by
                    # --pid panicked on the GPU host), over a long default-loader row and a short synthetic one
    $PY -m pip install -q --no-index --no-deps --target /tmp/pyspy .pyspy/*.whl || return 1
    timeout ${PROBE_TIMEOUT:-240} /tmp/pyspy/bin/py-spy record --idle --threads --nonblocking --format raw -r 100 \
        -o "$RES/pyspy-idle.txt" -- $PY benchmarks/host_probe.py --model resnet18 --jpeg --per-class 300 --work /tmp/zoo \
        --seconds 25 --base-seconds 2 --warmup 40 --only 'default options (cpu' --out "$RES" 2>&1 | grep "^|"
    $PY tools/pyspy_summary.py "$RES/pyspy-idle.txt" --top 25 | head -90
}
stage_convoy() {    # the GIL convoy on a GPU host: a wake-up's cost there, then who holds the GIL beside resnet18
    $PY benchmarks/gil_convoy.py --rounds 2 --out "$RES" 2>&1 | grep "^|"
    PROBE_ARGS="--jpeg --per-class 300 --seconds 8 --warmup 60 --only picked" stage_pyspy
}
stage_ab() {        # the read pipeline against the old tree carried in .old (git archive OLD fastdata | tar -x -C .old)
    timeout ${AB_TIMEOUT:-540} $PY benchmarks/ab_read.py --old "$PWD/.old" --per-class ${AB_PER_CLASS:-400} \
        --seconds ${AB_SECONDS:-5} --rounds ${AB_ROUNDS:-1} --rows ${AB_ROWS:-all} --out "$RES" 2>&1 | grep -v "Warning\|warn(" | tail -30
}
stage_dask() {      # needs dask + distributed: carry .whl (see the device README), installed here first
    [ -d .whl ] && $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
    timeout ${DASK_TIMEOUT:-300} $PY benchmarks/dask_build.py --per-class ${DASK_PER_CLASS:-1500} --reps ${DASK_REPS:-2} \
        2>&1 | grep -v "Warning\|warn(" | tail -15
    cp benchmarks/results/dask-build-* "$RES"/ 2>/dev/null
}
stage_s3() {        # needs s3fs + moto: carry .s3whl (pip download s3fs "moto[server]", trimmed: see README)
    $PY -m pip install -q --no-index --no-deps --target /tmp/s3site .s3whl/*.whl || return 1
    export PYTHONPATH="$PYTHONPATH:/tmp/s3site"
    timeout ${S3_TIMEOUT:-400} $PY benchmarks/s3_loader.py --per-class ${S3_PER_CLASS:-500} --size 224 \
        --seconds ${S3_SECONDS:-5} 2>&1 | grep -v "Warning\|warn(" | tail -14
    cp benchmarks/results/s3-loader-* "$RES"/ 2>/dev/null
}
stage_trace() {     # torch.profiler trace of the plain loop fed from the JPEG cache (jpeg_trace.py)
    timeout ${TRACE_TIMEOUT:-400} $PY benchmarks/jpeg_trace.py --model ${PROBE_MODEL:-resnet18} --work /tmp/zoo \
        --out "$RES" ${TRACE_ARGS:-} 2>&1 | grep -v "Warning\|warn(" | grep -v "^ *[]{}\"]" | tail -40
    gzip -c /tmp/zoo/trace1.json > "$RES/trace-resnet18-jpeg-engines.json.gz"
}
stage_lanes() {     # the nvjpeg loader alone by decoder, lanes and nvJPEG backend (stage probe --jpeg made the cache)
    timeout ${LANES_TIMEOUT:-240} $PY benchmarks/decode_lanes.py --jpeg /tmp/zoo/jpeg256 --out "$RES" \
        ${LANES_ARGS:-} 2>&1 | grep -v "Warning\|warn(" | tail -20
}
stage_decode() {    # decode-only img/s of the JPEG backends on the zoo's JPEG cache (stage zoo with --jpeg-backends made it)
    timeout ${DECODE_TIMEOUT:-200} $PY benchmarks/decode.py --src /tmp/zoo/src --jpeg /tmp/zoo/jpeg256 \
        --backends ${DECODE_BACKENDS:-nvjpeg} --seconds 5 --out "$RES" 2>&1 | grep -v "Warning\|warn(" | tail -15
}
stage_dali() {      # DALI joined from .dali*/part-* (tools/dali_parts.sh split, carried over several calls)
    bash tools/dali_parts.sh join || return 1
    export PYTHONPATH="$PYTHONPATH:/tmp/dalisite"
    $PY -c "import nvidia.dali as d; print('DALI', d.__version__)"
}
stage_buildspy() {  # where a --decoder nvjpeg build's time goes: py-spy (wheel carried in .pyspy), GIL holders per thread
    $PY -m pip install -q --no-index --no-deps --target /tmp/pyspy .pyspy/*.whl || return 1
    $PY -c "from fastdata.sample import make_image_folder as m; m('/tmp/bsrc', ${BUILD_PER_CLASS:-600})" >/dev/null
    cat /tmp/bsrc/*/* >/dev/null; rm -rf /tmp/bdest
    timeout ${BUILD_TIMEOUT:-240} /tmp/pyspy/bin/py-spy record --gil --threads --subprocesses --nonblocking --format raw -r 200 \
        -o "$RES/pyspy-gpubuild.txt" -- $PY -m fastdata.cli build-cache /tmp/bsrc /tmp/bdest --decoder nvjpeg 2>&1 | tail -4
    $PY tools/pyspy_summary.py "$RES/pyspy-gpubuild.txt" | head -50
}
stage_build() {
    timeout ${BUILD_TIMEOUT:-240} $PY benchmarks/build.py --per-class ${BUILD_PER_CLASS:-600} --out "$RES" ${BUILD_ARGS:-} 2>&1 | tail -22
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
for s in "$@"; do
    echo "=== stage $s ($(date +%T))"
    "stage_$s" || echo "=== stage $s FAILED"
done
tar czf "${OUT:-/tmp}/wave2-$(date +%H%M%S).tgz" -C "$RES" .
echo "=== done ($(date +%T))"
