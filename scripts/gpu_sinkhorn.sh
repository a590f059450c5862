#!/usr/bin/env bash
# fastdpot's Sinkhorn vs GeomLoss (KeOps) on a CUDA machine, within a time budget:
#   bash scripts/gpu_sinkhorn.sh [SECONDS] [bench.gpu_sinkhorn options, e.g. --impls geomloss_tensorized,...]
#   (SECONDS: default 90, the whole script, install included)
# 1. installs the pure-Python wheels .whl/{pykeops,keopscore,geomloss}-*.whl (see docs/sinkhorn.md) into /tmp/site,
#    offline (--no-index --no-deps: torch, numpy, scipy, pybind11 are the machine's own);
# 2. points KeOps at a fresh cache folder and at the CUDA toolkit (CUDA_PATH/CUDA_HOME, /usr/local/cuda if unset);
# 3. runs `python -m bench.gpu_sinkhorn --budget-s (SECONDS - 10)` under `timeout -s INT` a few seconds short of
#    SECONDS (an interrupted run prints its table and keeps its rows);
# 4. stores this run's document in bench/results/ (pytest-benchmark JSON, bench/store.py) and, when $OUT is set,
#    copies it (gpu_sinkhorn_results-<date>.json), the table (gpu_sinkhorn_table.md) and the log (gpu_sinkhorn.log)
#    there.
# Exit status: 0 unless the benchmark itself crashed (no CUDA, a missing wheel, a KeOps failure or the time limit
# are reported, not fatal).
set -u
cd "$(dirname "$0")/.." || exit 0
TOTAL=${1:-90}
shift $(( $# > 0 ? 1 : 0 ))
BUDGET=$(( TOTAL > 30 ? TOTAL - 10 : TOTAL * 2 / 3 ))
HARD=$(( TOTAL > 10 ? TOTAL - 3 : TOTAL ))
PY=$(command -v python3 || command -v python)
export MPLBACKEND=Agg PYTHONUNBUFFERED=1

# only this benchmark's wheels (other wheels in .whl/ belong to other scripts; one that does not fit this Python
# must not block these)
WHEELS=$(ls .whl/pykeops-*.whl .whl/keopscore-*.whl .whl/geomloss-*.whl 2>/dev/null)
if [ -n "$WHEELS" ]; then
    # shellcheck disable=SC2086
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHEELS; then
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "gpu_sinkhorn: installing the .whl/ wheels failed; using whatever pykeops/geomloss are installed"
    fi
else
    echo "gpu_sinkhorn: no pykeops/keopscore/geomloss wheels in .whl/; using whatever is installed"
fi

export KEOPS_CACHE_FOLDER=${KEOPS_CACHE_FOLDER:-$(mktemp -d /tmp/keops_cache.XXXXXX)}
if [ -z "${CUDA_PATH:-}" ] && [ -z "${CUDA_HOME:-}" ]; then
    if [ -d /usr/local/cuda ]; then
        export CUDA_HOME=/usr/local/cuda
    elif command -v nvcc >/dev/null 2>&1; then
        export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
    fi
fi
export CUDA_PATH=${CUDA_PATH:-${CUDA_HOME:-}} CUDA_HOME=${CUDA_HOME:-${CUDA_PATH:-}}
[ -z "${CUDA_HOME}" ] && unset CUDA_HOME CUDA_PATH
# KeOps loads libnvrtc through ctypes.util.find_library (the ldconfig cache, then LD_LIBRARY_PATH); when that finds
# nothing, KeOps falls back to CPU. Then expose *only* libnvrtc/libcudart (symlinks in a private folder, appended to
# LD_LIBRARY_PATH, so torch's own CUDA libraries are not redirected), from the toolkit or from the pip nvidia packages.
if ! "$PY" -c "import ctypes.util as u, sys; sys.exit(0 if u.find_library('nvrtc') else 1)" 2>/dev/null; then
    LIBDIR=$(mktemp -d /tmp/keops_cuda_libs.XXXXXX)
    for dir in "${CUDA_HOME:-/nonexistent}/lib64" "${CUDA_HOME:-/nonexistent}/targets/x86_64-linux/lib" \
               $("$PY" -c "import glob, os, site; [print(d) for p in site.getsitepackages() for d in sorted(glob.glob(os.path.join(p, 'nvidia', '*', 'lib')))]" 2>/dev/null); do
        if ls "$dir"/libnvrtc.so* >/dev/null 2>&1; then
            ln -sf "$dir"/libnvrtc* "$dir"/libcudart* "$LIBDIR"/ 2>/dev/null
            for name in nvrtc cudart; do  # `ld -lnvrtc` (find_library's last resort) wants the unversioned name
                main=$(ls "$dir"/lib$name.so.* 2>/dev/null | grep -v builtins | head -n 1)
                [ -e "$LIBDIR/lib$name.so" ] || { [ -n "$main" ] && ln -sf "$main" "$LIBDIR/lib$name.so"; }
            done
            export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$LIBDIR
            echo "gpu_sinkhorn: libnvrtc not in the loader cache; using the one in $dir"
            break
        fi
    done
fi
echo "gpu_sinkhorn: budget ${TOTAL} s (benchmark ${BUDGET} s, hard stop ${HARD} s); CUDA_HOME=${CUDA_HOME:-unset};" \
     "KEOPS_CACHE_FOLDER=${KEOPS_CACHE_FOLDER}"

RES=$(mktemp /tmp/gpu_sinkhorn_rows.XXXXXX.json)
STAMP=$(date +%Y%m%dT%H%M%S)
TABLE=$(mktemp /tmp/gpu_sinkhorn_table.XXXXXX.md)
LOG=$(mktemp /tmp/gpu_sinkhorn_log.XXXXXX.txt)
timeout -s INT -k 5 "$HARD" "$PY" -m bench.gpu_sinkhorn "$@" --budget-s "$BUDGET" --results "$RES" --table "$TABLE" \
    --note "scripts/gpu_sinkhorn.sh" 2>&1 | tee "$LOG"
status=${PIPESTATUS[0]}
case $status in
    0) ;;
    124|130|137) echo "gpu_sinkhorn: stopped by the ${HARD} s limit (status $status); rows so far kept"; status=0 ;;
    *) echo "gpu_sinkhorn: the benchmark exited with status $status" ;;
esac

[ -s "$RES" ] && cp "$RES" "bench/results/gpu_sinkhorn-$STAMP.json"
chmod a+r "$RES" "$TABLE" "$LOG" 2>/dev/null
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    [ -s "$RES" ] && cp "$RES" "$OUT/gpu_sinkhorn_results-$STAMP.json" 2>/dev/null  # the script may run twice
    cat "$TABLE" >> "$OUT/gpu_sinkhorn_table.md" 2>/dev/null || true
    cat "$LOG" >> "$OUT/gpu_sinkhorn.log" 2>/dev/null || true
fi
exit $status
