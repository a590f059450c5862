#!/usr/bin/env bash
# One-time set-up of a fresh machine: the Fashion-MNIST Debian package (if missing), CPU torch (pinned, so no CUDA
# build is downloaded), fastdpot with its C++ extension (editable) and the extras named in $1 (default: test,job,bench).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test,job,bench}"
# Real data for the main job and the real-data tests: Fashion-MNIST from Debian's dataset-fashion-mnist.
data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ] && [ ! -f "$data/train-images-idx3-ubyte" ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        { apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist; } ||
            echo "could not install dataset-fashion-mnist: real-data tests will skip" >&2
    else
        echo "Fashion-MNIST is missing: run as root or 'sudo apt-get install -y dataset-fashion-mnist'" >&2
        echo "(without it the main job falls back to scikit-learn's digits and real-data tests skip)" >&2
    fi
fi
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[${extras}]"
