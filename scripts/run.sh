#!/usr/bin/env bash
# The main job on a fresh machine: the Fashion-MNIST Debian package (if missing), the Python set-up, then a private
# image-generation run with the defaults (ε = 10, δ = 1e-5) into runs/<name>/. Extra arguments go to `fastdpot flow`
# (e.g. `bash scripts/run.sh --epsilon inf`, `bash scripts/run.sh --quick`).
set -euo pipefail
cd "$(dirname "$0")/.."
data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ] && [ ! -f "$data/train-images-idx3-ubyte" ]; then
    if [ "$(id -u)" -eq 0 ]; then
        apt-get update && apt-get install -y dataset-fashion-mnist
    else
        echo "Fashion-MNIST is missing: run as root or 'sudo apt-get install -y dataset-fashion-mnist'" >&2
        echo "(without it the job falls back to scikit-learn's digits)" >&2
    fi
fi
bash scripts/setup.sh job
python -m fastdpot flow "$@"
