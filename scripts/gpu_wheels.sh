#!/usr/bin/env bash
# Fetch the pure-Python packages that a GPU machine without network lacks (see docs/gpu.md) into .whl/ (git-ignored),
# for Python 3.12 x86-64: dp-accounting + dm-tree (the accountant of the API run), pykeops + keopscore + geomloss
# (the Sinkhorn comparison), POT (the tests comparing with ot.sliced). scripts/gpu_check.sh installs them there offline; pass .whl as a carried path.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PLAT=(--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform any)
python -m pip download -q --no-deps "${PLAT[@]}" -d .whl "dp-accounting==0.6.0" "dm-tree==0.1.10" "geomloss==0.3.1" "pot==0.9.7.post1"
python -m pip wheel -q --no-deps -w .whl "pykeops==2.3" "keopscore==2.3"  # sdists only on the index: build wheels
ls -l .whl
