#!/usr/bin/env bash
# The test command (README "Run the tests"; .ci/run calls exactly this): set-up, then the default test run.
# Triton kernels run on CPU under TRITON_INTERPRET=1; tests marked `slow` are excluded (run: scripts/test.sh -m slow).
# The documentation site is built strictly first (broken links fail the run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
export TRITON_INTERPRET=1
export KEOPS_CACHE_FOLDER="${KEOPS_CACHE_FOLDER:-$PWD/.cache/keops}"
export MPLBACKEND=Agg
python -m fastdpot.env
# the docs site must build with no broken link (mkdocs-material, mkdocstrings; offline)
NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet --site-dir "${TMPDIR:-/tmp}/fastdpot-site"
python -m pytest -q -ra --durations=30 "$@"
