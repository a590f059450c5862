#!/usr/bin/env bash
# The main job on a fresh machine: set-up (the Fashion-MNIST Debian package if missing, the Python packages), then a private
# image-generation run with the defaults (ε = 10, δ = 1e-5) into runs/<name>/. Extra arguments go to `fastdpot flow`
# (e.g. `bash scripts/run.sh --epsilon inf`, `bash scripts/run.sh --quick`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh job
python -m fastdpot flow "$@"
