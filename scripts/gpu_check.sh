#!/usr/bin/env bash
# One command for a CUDA machine (a device lease of about ten minutes): build fastdpot with its CUDA extension, run the
# CUDA tests, time every stage of a flow step, run the GPU benchmarks, a private 10^7-particle flow through the public
# API, the Sinkhorn comparison with GeomLoss and the LDP half-circle experiment at the paper's size.
#   FASTDPOT_TREE_COMMIT=<git rev-parse --short HEAD of the caller> bash scripts/gpu_check.sh [--quick]
# GPU_CHECK_BUDGET_S: the whole script's wall time (default 540 s); GPU_CHECK_ONLY="build tests ...": run only the
# named steps (a rerun of what failed); GPU_CHECK_TESTS: the pytest arguments of the tests step.
# (the machine's copy of .git can be stale: the rows then name the tree the caller sent, see bench/harness.git_rev)
# Each part has its own time limit and the parts run in order of importance, so a slow part cannot starve the rest.
# Uses the torch (CUDA build) and Triton of the machine; never installs torch. Pure-Python packages the machine lacks
# (dp-accounting, pykeops, keopscore, geomloss) come as wheels in .whl/ (carried by the caller, see docs/gpu.md).
# Results: documents in bench/results/ (suites gpu_flow, gpu_sinkhorn; pytest-benchmark JSON, bench/store.py),
# bench/gpu_flow_table.md, and under $OUT (when set): gpu_check.log, gpu_flow_results.json, gpu_flow_table.md,
# ldp_400k.json and the Sinkhorn files.
set -uo pipefail
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET  # compiled kernels, not the interpreter
export MPLBACKEND=Agg PYTHONUNBUFFERED=1
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
OUTDIR="${OUT:-$PWD/runs/gpu_check}"
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu_check.log"
: > "$LOG"
status=0
T0=$(date +%s)

BUDGET=${GPU_CHECK_BUDGET_S:-540}  # the whole script's wall time: a step that cannot finish inside it is skipped
step() {  # step NAME LIMIT_S CMD...: run CMD under a time limit, log it, remember a failure
    local name=$1 limit=$2
    shift 2
    if [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY " != *" $name "* ]]; then return; fi
    local left=$(( BUDGET - ($(date +%s) - T0) ))
    if (( left < 20 )); then echo "=== $name: skipped, $left s left of the ${BUDGET} s budget" | tee -a "$LOG"; return; fi
    (( limit > left )) && limit=$left
    echo "=== [$(( $(date +%s) - T0 )) s] $name (limit ${limit} s)" | tee -a "$LOG"
    local t=$(date +%s)
    timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc after $(( $(date +%s) - t )) s" | tee -a "$LOG"
    [ "$rc" -eq 0 ] || status=1
}

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch; nothing to do."
    exit 0
fi
python -c "import triton" || { echo "gpu_check: triton is not installed (pip install triton)"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$LOG"

# carried wheels (offline); dm-tree and dp-accounting are needed by the accountant of the API run
if ls .whl/*.whl >/dev/null 2>&1; then
    python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# build: the C++ CPU extensions and the CUDA extension (nvcc, for this GPU's architecture); --no-build-isolation so the
# build sees the CUDA torch, --no-deps keeps the installed one
step build 180 python -m pip install -q --no-build-isolation --no-deps -e .
if ! python -c "import fastdpot._C_cuda_flow"; then  # keep the rest of the checks going without the CUDA extension
    echo "gpu_check: the CUDA extension did not build; building without it (the cuda backend will be missing)"
    status=1
    FASTDPOT_CUDA=0 python -m pip install -q --no-build-isolation --no-deps -e . 2>&1 | tail -3
fi
step versions 60 python -c "import torch, triton, fastdpot._cuda_prims as c; print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'triton', triton.__version__, torch.cuda.get_device_name(0)); print('cuda backend:', c.cuda_status())"

# 1. correctness on CUDA: the cuda backend (CUB primitives vs torch, backend vs replay and triton), the Triton kernels
#    (every test marked cuda or triton: the cuda backend vs the torch primitives and the replay, the compiled Triton
#    kernels, the sketch release's CUDA and Triton kernels, the 1-GPU NCCL sharded flow against gloo on the CPU)
read -r -a TESTS <<< "${GPU_CHECK_TESTS:-tests/ops tests/flows tests/bench tests/apps/test_ldp.py}"
step tests 200 python -m pytest -q -ra -p no:cacheprovider -n 4 -m "cuda or triton" "${TESTS[@]}"

# 2. where the time goes: each stage of one chunk, both GPU backends (N = 1e7 per-row sorts; N = 1e6 both modes at
#    the end, when time is left)
step stages-1e7 75 python -m bench.gpu_profile --stages --size 10000000,48,128

# 3. the benchmark table (flow step: triton / cuda, exact / histogram, reference at N <= 1e6; DP-SWD loss with the
#    torch.compile anchor), then a private 10^7-particle run through DPSlicedWassersteinFlow (cuda backend)
if [ "$QUICK" = 1 ]; then SIZES=(--only 1000000,48,128); else SIZES=(--only 10000000,48,128 --only 1000000,48,128); fi
GPU_FLOW_RES="bench/results/gpu_flow-$(date +%Y%m%dT%H%M%S).json"
step bench-flow 150 python -m bench.gpu_flow "${SIZES[@]}" --cases flow_step --max-reference-n 1e6 \
    --table bench/gpu_flow_table.md --note "scripts/gpu_check.sh" --results "$GPU_FLOW_RES"
step bench-dpswd 120 python -m bench.gpu_flow --dpswd-only 1000000,48,128 --note "scripts/gpu_check.sh" \
    --results "$GPU_FLOW_RES"
step sketch-release 40 python -m bench.gpu_flow --sketch-only 1000000,48,128 --note "scripts/gpu_check.sh" \
    --results "$GPU_FLOW_RES"
step api-run 75 python -m bench.gpu_flow --api-run "${GPU_CHECK_API_RUN:-1e7,48,128,20}" \
    --note "scripts/gpu_check.sh api run" --results "$GPU_FLOW_RES"
cp bench/gpu_flow_table.md "$OUTDIR/" 2>/dev/null || true
cp "$GPU_FLOW_RES" "$OUTDIR/gpu_flow_results.json" 2>/dev/null || true

# 4. Sinkhorn on CUDA against GeomLoss (KeOps), and the LDP half-circle experiment at 400 000 points
# the dense engines first (no KeOps), then KeOps (online), which can crash in its code generation on a new CUDA
[ "$QUICK" = 1 ] || step sinkhorn-dense 70 bash scripts/gpu_sinkhorn.sh 65 --impls geomloss_tensorized,fastdpot_tensorized
[ "$QUICK" = 1 ] || step sinkhorn-keops 60 bash scripts/gpu_sinkhorn.sh 55 --impls geomloss_online,fastdpot,fastdpot_keops
step stages-1e6-segmented 40 python -m bench.gpu_profile --stages --size 1000000,48,128 --per-row no
step stages-1e6-per-row 40 python -m bench.gpu_profile --stages --size 1000000,48,128 --per-row yes
step softmin-lse 40 python -m bench.gpu_profile --lse 10000
step sweep-projection 45 python -m bench.gpu_profile --sweep --size 10000000,48,48
[ "$QUICK" = 1 ] || step ldp-400k 60 python -m fastdpot.experiments.papers.ldp --points 400000 --data-batch 2048 --steps 300 \
    --eval-points 2000 --replayable-noise --device cuda --backend tensorized --time-budget-s 30 \
    --out "$OUTDIR/ldp_400k.json"

cp bench/gpu_flow_table.md "$OUTDIR/" 2>/dev/null || true
cp "$GPU_FLOW_RES" "$OUTDIR/gpu_flow_results.json" 2>/dev/null || true
echo "gpu_check: done in $(( $(date +%s) - T0 )) s, status $status" | tee -a "$LOG"
exit $status
