#!/usr/bin/env bash
# The private-only protocol's report (docs/mainjob-private.md): every run of its table into results/private_only/,
# then the table. Each run is an independent run on the same sensitive / validation split whose own composed ε is
# the one it reports; the settings are the defaults, chosen on the validation split's stand-in
# (python -m fastdpot.experiments.private_tuning). PARALLEL=2 runs two at a time with one thread each.
# Usage: bash scripts/private_only.sh [extra arguments for every run]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-results/private_only}
PARALLEL=${PARALLEL:-1}
mkdir -p "$OUT"
runs=()
for seed in 1 2 3; do
  runs+=("eps10_seed$seed --epsilon 10 --seed $seed")
  runs+=("eps1_seed$seed --epsilon 1 --seed $seed")
done
runs+=("gaussian_eps10 --method gaussian --epsilon 10 --seed 1")
runs+=("gaussian_eps1 --method gaussian --epsilon 1 --seed 1")
runs+=("inf --epsilon inf --seed 1")
runs+=("decoded --method decoded --epsilon inf --seed 1")
threads=$(( $(nproc) / PARALLEL )); (( threads >= 1 )) || threads=1
run_one() {
  local name=$1; shift
  [[ -f "$OUT/$name/metrics.json" ]] && { echo "skip $name (done)"; return; }
  OMP_NUM_THREADS=$threads python -m fastdpot flow --public-size 0 --classifiers cnn --runs-dir "$OUT" --name "$name" \
    --no-progress "$@" \
    > "$OUT/$name.log" 2>&1 && echo "done $name" || echo "FAILED $name (see $OUT/$name.log)"
}
for spec in "${runs[@]}"; do
  # shellcheck disable=SC2086
  run_one $spec "$@" &
  while (( $(jobs -rp | wc -l) >= PARALLEL )); do wait -n; done
done
wait
python -m fastdpot.experiments.private_only "$OUT"
