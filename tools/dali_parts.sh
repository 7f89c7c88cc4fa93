#!/usr/bin/env bash
# DALI for the lent GPU machine, which cannot reach a package index and takes 64 MiB per call.
#
#   bash tools/dali_parts.sh split [SITE]   here: pack DALI and what it imports (nvidia/{dali,nvimgcodec,
#                                           nvjpeg}, astunparse, gast, six, packaging, and a cp312 optree
#                                           wheel) from SITE (default: .venv's site-packages) into a tar.xz,
#                                           split into .dali1..N/part-* of at most 60 MiB each (with the
#                                           ~3 MB tracked tree a call stays under its 64 MiB) (+ .dali1/SHA256SUMS);
#                                           carry one folder per call, calls back to back (the machine keeps
#                                           ignored files only while it stays warm). DALI's C++ headers
#                                           (include/, for building plugins) stay behind
#   bash tools/dali_parts.sh join           there: join the parts into /tmp/dalisite (once per machine);
#                                           the caller puts /tmp/dalisite on PYTHONPATH
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
split)
    site=${2:-$(.venv/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")}
    stage=$(mktemp -d)
    mkdir -p "$stage/nvidia"
    cp -r "$site"/nvidia/{dali,nvimgcodec,nvjpeg} "$stage/nvidia/"
    cp -r "$site"/{astunparse,gast,six.py,packaging} "$stage/"
    find "$stage/nvidia/dali" -maxdepth 1 -name "*.cpython-3*" ! -name "*cpython-312-*" -delete
    rm -rf "$stage/nvidia/dali/include"
    find "$stage" -name __pycache__ -prune -exec rm -rf {} +
    .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 -d "$stage/wheel" "optree==$(.venv/bin/python -c 'import optree; print(optree.__version__)')"
    python3 -m zipfile -e "$stage"/wheel/optree-*.whl "$stage" && rm -rf "$stage/wheel"
    tar -C "$stage" -cf - . | xz -9e -T2 > /tmp/dali.tar.xz
    rm -rf "$stage" .dali[0-9]*
    part=$((60 * 1024 * 1024))
    split -n $(( ($(stat -c %s /tmp/dali.tar.xz) + part - 1) / part )) -a 2 /tmp/dali.tar.xz /tmp/dali.part-
    k=1
    for p in /tmp/dali.part-*; do mkdir -p ".dali$k" && mv "$p" ".dali$k/part-${p##*-}"; k=$((k + 1)); done
    (cd /tmp && sha256sum dali.tar.xz) > .dali1/SHA256SUMS && rm /tmp/dali.tar.xz
    ls -d .dali*
    ;;
join)
    [ -d /tmp/dalisite/nvidia/dali ] && exit 0
    cat .dali*/part-* > /tmp/dali.tar.xz
    (cd /tmp && sha256sum -c "$OLDPWD/.dali1/SHA256SUMS")
    mkdir -p /tmp/dalisite && tar -C /tmp/dalisite -xJf /tmp/dali.tar.xz && rm /tmp/dali.tar.xz
    ;;
*)
    echo "usage: bash tools/dali_parts.sh split [SITE] | join" >&2; exit 2 ;;
esac
