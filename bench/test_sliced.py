"""pytest-benchmark suite ``sliced``: the (DP) sliced Wasserstein loss, forward + backward (cases: bench/sliced.py).

One group per case and size: ``fastdpot`` beside its anchors (``pot``, ``reference``). ``-k quick``: tiny sizes.
"""
import pytest

from bench import sliced as S
from bench.harness import run_benchmark

PARAMS = [(size, case, impl) for size in S.SIZES for case in S.CASES for impl in S.IMPLS[case]]
#: rounds of the calls that take a minute or more at the full sizes
ROUNDS = {("1e5", "sw", "pot"): 2}


@pytest.mark.parametrize("size,case,impl", PARAMS, ids=["-".join(p) for p in PARAMS])
def test_sliced(benchmark, size, case, impl):
    params = S.SIZES[size]
    run_benchmark(benchmark, S.CASES[case](impl, **params), suite=S.SUITE, name=case, impl=impl, params=params,
                  mode="full", anchors=S.ANCHORS, rounds=ROUNDS.get((size, case, impl), 3))
