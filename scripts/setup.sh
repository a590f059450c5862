#!/usr/bin/env bash
# One-time set-up of a fresh machine: CPU torch (pinned, so no CUDA build is downloaded), fastdpot with its
# C++ extension (editable) and the extras named in $1 (default: test,job,bench).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test,job,bench}"
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[${extras}]"
