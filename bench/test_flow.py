"""pytest-benchmark suite ``flow``: one DP sliced-Wasserstein flow step, forward (cases: bench/flow.py).

One group per case and size: ``fastdpot`` (the C++ step) beside its anchor (``reference``; ``matmul`` for the
pixel-space step). ``-k quick``: tiny sizes.
"""
import pytest

from bench import flow as F
from bench.harness import run_benchmark

PARAMS = [(size, case, impl) for case in F.CASES for size in F.CASE_SIZES.get(case, F._LATENT)
          for impl in F.IMPLS[case] if (size, case, impl) not in F.SKIP]
#: the torch reference at N = 1e6 takes 30-60 s a call (the histogram one 15 GB): fewer rounds
ROUNDS = {("1e6", "step", "reference"): 2, ("1e6", "histogram_step", "reference"): 1,
          ("pixel", "oneshot_generation", "dense"): 1, ("celeba", "pixel_step", "npsort"): 1,
          # a ratio near 1 (issue 45): more rounds of these 0.3 s calls
          ("2e5", "histogram_vs_exact", "histogram"): 7, ("2e5", "histogram_vs_exact", "exact"): 7,
          # issue 45's pixel step against its anchors: sub-second calls whose medians moved by 20 % between runs of
          # 3 rounds on a 2-core VM (one slow round in three)
          **{("pixel", "pixel_step", impl): 9 for impl in ("fastdpot", "matmul", "npsort")}}


@pytest.mark.parametrize("size,case,impl", PARAMS, ids=["-".join(p) for p in PARAMS])
def test_flow(benchmark, size, case, impl):
    params = dict(F.SIZES[size], **F.EXTRA.get(case, {}))
    run_benchmark(benchmark, F.CASES[case](impl, **params), suite=F.SUITE, name=case, impl=impl, params=params,
                  mode="forward", anchors=F.ANCHORS, rounds=ROUNDS.get((size, case, impl), 3))
