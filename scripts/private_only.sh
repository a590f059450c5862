#!/usr/bin/env bash
# The private-only protocol's report (docs/mainjob-private.md): every run of its table into results/private_only/,
# then the table. Each run is an independent run on the same sensitive / validation split whose own composed ε is
# the one it reports (a benchmark on a public data set standing in for a sensitive one: a user publishes ONE run;
# scripts/committed_epsilon.py composes everything committed). The settings are the defaults: the ε table chosen on
# the validation split's stand-in (python -m fastdpot.experiments.mainjob.tuning --set public_size=0).
# PARALLEL=2 runs two at a time with one thread each. Usage: bash scripts/private_only.sh [extra arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/private_only}
PARALLEL=${PARALLEL:-1}
mkdir -p "$OUT"
FID="--fid-samples 10000 --fid-real 10000"  # FID of 10 000 synthetic against 10 000 sensitive images
NOFID="--fid-samples 0"  # about 25 min of Inception on 2 cores per 10 000 images: FID for the first seed only
runs=()
# first what decides the comparison: the one-shot method, the per-class DP Gaussian in the DP-PCA code space, the
# pipeline's ceiling, the classifier's ceiling; then the other seeds (accuracy, label fidelity); then the per-step flow
for eps in 10 1; do runs+=("oneshot_eps${eps}_seed1 --epsilon $eps --seed 1 $FID"); done
for eps in 10 1; do runs+=("gaussian_eps${eps}_seed1 --method gaussian --epsilon $eps --seed 1 $FID"); done
runs+=("oneshot_inf --epsilon inf --seed 1 $FID")  # the same pipeline without noise: its ceiling
# ANALYSIS, not private: the sensitive images themselves as the synthetic set, the classifier's own ceiling
runs+=("real --method decoded --rep-kind pixels --epsilon inf --seed 1 $NOFID")
for seed in 2 3; do
  for eps in 10 1; do
    runs+=("oneshot_eps${eps}_seed$seed --epsilon $eps --seed $seed $NOFID")
    runs+=("gaussian_eps${eps}_seed$seed --method gaussian --epsilon $eps --seed $seed $NOFID")
  done
done
runs+=("flow_eps10 --method flow --epsilon 10 --seed 1 $FID")  # the per-step label-private flow (DPSWflow-r)
runs+=("flow_eps1 --method flow --epsilon 1 --seed 1 $FID")
threads=$(( $(nproc) / PARALLEL )); (( threads >= 1 )) || threads=1
run_one() {
  local name=$1; shift
  [[ -f "$OUT/$name/metrics.json" ]] && { echo "skip $name (done)"; return; }
  OMP_NUM_THREADS=$threads python -m fastdpot flow --public-size 0 --runs-dir "$OUT" --name "$name" \
    --no-progress "$@" \
    > "$OUT/$name.log" 2>&1 && echo "done $name" || echo "FAILED $name (see $OUT/$name.log)"
}
for spec in "${runs[@]}"; do
  # shellcheck disable=SC2086
  run_one $spec "$@" &
  while (( $(jobs -rp | wc -l) >= PARALLEL )); do wait -n; done
done
wait
# the default run as a user starts it (its own evaluation: CNN, label fidelity, FID 2 000 against 2 000), cold in a
# folder of its own with a cache of its own (no cached statistics), for its wall time
mkdir -p "${OUT}_default"
OUT="${OUT}_default" FASTDPOT_CACHE="$(mktemp -d)" run_one default_eps10 --epsilon 10 --seed 4 "$@"
python -m fastdpot.experiments.mainjob.report "$OUT"
python scripts/committed_epsilon.py results
