#!/usr/bin/env bash
# One command for a CUDA machine: build fastdpot, run the CUDA and compiled-Triton tests, then the GPU benchmark.
#   bash scripts/gpu_check.sh [--quick] [--budget-s S]   (benchmark options: --quick = N in {1e5, 1e6} only;
#                                                         --budget-s = stop starting new sizes after S seconds)
# Uses the torch (CUDA build) and Triton already installed; never installs torch. Results: bench/results.jsonl
# (rows of suite gpu_flow), the markdown table bench/gpu_flow_table.md, and copies of both in $OUT when set.
set -euo pipefail
cd "$(dirname "$0")/.."
unset TRITON_INTERPRET  # compiled kernels, not the interpreter
export MPLBACKEND=Agg

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch; nothing to do."
    exit 0
fi
python -c "import triton" || { echo "gpu_check: triton is not installed (pip install triton)"; exit 1; }

# build: the C++ extension (Triton needs no build); --no-deps keeps the installed (CUDA) torch
python -m pip install -q --no-build-isolation --no-deps -e . \
    || FASTDPOT_SKIP_CPP_BUILD=1 python -m pip install -q --no-build-isolation --no-deps -e .
python -c "import dp_accounting, scipy, tqdm, pytest" 2>/dev/null \
    || timeout 120 python -m pip install -q dp-accounting tqdm scipy pytest 2>/dev/null \
    || echo "gpu_check: could not install test dependencies (offline?); using what is installed"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python -m fastdpot.env || true

status=0
python -m pytest -q -ra -p no:cacheprovider tests/test_gpu.py tests/test_triton_flow.py tests/test_triton_dpswd.py \
    tests/test_triton_compile.py || status=$?

python -m bench.gpu_profile || status=$?  # per-kernel device time of one step at N = 1e7, d = 48, k = 128
python -m bench.gpu_flow "$@" --table bench/gpu_flow_table.md --note "scripts/gpu_check.sh" || status=$?
# a private CelebA-latent-shaped flow of 10^7 particles through the public API (exact and histogram modes)
python -m bench.gpu_flow --api-run "${GPU_CHECK_API_RUN:-1e7,48,128,20}" --note "scripts/gpu_check.sh api run" \
    || status=$?

if [ -n "${OUT:-}" ]; then
    cp bench/gpu_flow_table.md "$OUT/" 2>/dev/null || true
    grep '"suite": "gpu_flow"' bench/results.jsonl > "$OUT/gpu_flow_results.jsonl" 2>/dev/null || true
fi
exit $status
