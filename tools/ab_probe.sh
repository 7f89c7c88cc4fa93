#!/usr/bin/env bash
# A/B of the JPEG-cache probe between an earlier commit and this tree, in one device call, alternating:
#
#   bash tools/ab_probe.sh REV [ONLY]        e.g. bash tools/ab_probe.sh 0794af2^ NVJPG,decode_jpeg
#
# REV's fastdata/ and the probe's benchmark files are exported to .ab/REV (ignored by git). The device machine
# gets no git history, so export here first (AB_EXPORT_ONLY=1 bash tools/ab_probe.sh REV), then run the same
# command there with .ab and .photos carried (FASTDATA_PHOTOS=$PWD/.photos). Each host_probe.py run has its
# own synthetic row: compare the ratios, REV against this tree, run by run. One line per row is printed;
# result files land in $OUT (or /tmp/ab).
set -euo pipefail
cd "$(dirname "$0")/.."
REV=${1:?give the earlier commit}; ONLY=${2:-NVJPG,decode_jpeg}
OLD=.ab/$(echo "$REV" | tr -c 'A-Za-z0-9\n' _)
if [ ! -d "$OLD/fastdata" ]; then
    mkdir -p "$OLD"
    git archive "$REV" fastdata benchmarks/host_probe.py benchmarks/_jpeg_probe.py benchmarks/_common.py \
        benchmarks/models.py benchmarks/_datasets.py | tar -x -C "$OLD"
fi
[ -n "${AB_EXPORT_ONLY:-}" ] && { echo "exported $OLD"; exit 0; }
RES=${OUT:-/tmp/ab}
for t in old new old new; do
    d=.; [ $t = old ] && d=$OLD          # (the probe's _common puts its own tree first on sys.path)
    timeout ${AB_TIMEOUT:-200} python3 "$d/benchmarks/host_probe.py" --model resnet18 --per-class ${AB_PER_CLASS:-500} \
        --jpeg --only "$ONLY" --work /tmp/ab-data --out "$RES/$t-$RANDOM" 2>&1 | grep "^| [sj]" | cut -c1-110 | sed "s/^/$t /" || echo "$t: no rows (exit or timeout)"
done
